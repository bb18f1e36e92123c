// Model: loading (weights, tokenizer, RoPE table, scratch) and the layer loop of the forward
// pass; MLA lives in mla.cpp.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <set>

#include <nlohmann/json.hpp>

#include "base/check.h"
#include "base/log.h"
#include "base/mmap.h"
#include "model/model_impl.h"

namespace fathom {

RopeParams rope_params(const ModelConfig& c) {
  RopeParams rp;
  rp.dim = c.qk_rope_head_dim;
  rp.theta = c.rope_theta;
  if (c.rope_scaling.yarn) {
    rp.factor = c.rope_scaling.factor;
    rp.original_max_positions = c.rope_scaling.original_max_position_embeddings;
    rp.beta_fast = c.rope_scaling.beta_fast;
    rp.beta_slow = c.rope_scaling.beta_slow;
    rp.mscale = c.rope_scaling.mscale;
    rp.mscale_all_dim = c.rope_scaling.mscale_all_dim;
  }
  return rp;
}
namespace {

Result<std::unique_ptr<Tokenizer>> load_tokenizer(const ModelWeights& w) {
  if (w.format == "hf") {
    const std::string path = (std::filesystem::path(w.path) / "tokenizer.json").string();
    if (!std::filesystem::exists(path)) return not_found("'{}' has no tokenizer.json", w.path);
    return Tokenizer::from_files(w.path);
  }
  const GgufFile& g = *w.gguf;
  VocabData v;
  v.model = TRY(g.get_string("tokenizer.ggml.model"));
  if (g.get("tokenizer.ggml.pre") != nullptr) v.pre = TRY(g.get_string("tokenizer.ggml.pre"));
  const GgufValue* tokens = g.get("tokenizer.ggml.tokens");
  if (tokens == nullptr || tokens->elem_type != GgufType::kString) {
    return not_found("{}: tokenizer.ggml.tokens (an array of strings) is missing", g.path());
  }
  for (const auto& t : tokens->arr) v.tokens.push_back(t.s);
  if (const GgufValue* types = g.get("tokenizer.ggml.token_type")) {
    for (const auto& t : types->arr) v.token_types.push_back(static_cast<int32_t>(t.as_int()));
  }
  if (const GgufValue* merges = g.get("tokenizer.ggml.merges")) {
    for (const auto& m : merges->arr) v.merges.push_back(m.s);
  }
  auto opt_id = [&](const char* key) -> Result<int32_t> {
    if (g.get(key) == nullptr) return kNoToken;
    return static_cast<int32_t>(TRY(g.get_int(key)));
  };
  v.bos_id = TRY(opt_id("tokenizer.ggml.bos_token_id"));
  v.eos_id = TRY(opt_id("tokenizer.ggml.eos_token_id"));
  v.pad_id = TRY(opt_id("tokenizer.ggml.padding_token_id"));
  if (g.get("tokenizer.ggml.add_bos_token") != nullptr) v.add_bos = TRY(g.get_bool("tokenizer.ggml.add_bos_token"));
  if (g.get("tokenizer.ggml.add_eos_token") != nullptr) v.add_eos = TRY(g.get_bool("tokenizer.ggml.add_eos_token"));
  if (g.get("tokenizer.chat_template") != nullptr) v.chat_template = TRY(g.get_string("tokenizer.chat_template"));
  return Tokenizer::from_vocab_data(v);
}

MoeGateParams gate_params(const ModelConfig& c, const float* bias) {
  MoeGateParams g;
  g.n_experts = c.n_routed_experts;
  g.top_k = static_cast<int>(c.num_experts_per_tok);
  g.scoring = c.scoring_func == ScoringFunc::kSigmoid ? MoeScoring::kSigmoid : MoeScoring::kSoftmax;
  const bool grouped = c.topk_method != TopkMethod::kGreedy && c.n_group > 1;
  g.n_groups = grouped ? static_cast<int>(c.n_group) : 1;
  g.topk_groups = grouped ? static_cast<int>(c.topk_group) : 1;
  g.group_score = c.topk_method == TopkMethod::kNoauxTc ? MoeGroupScore::kTop2Sum : MoeGroupScore::kMax;
  g.bias = bias;
  g.normalize = c.norm_topk_prob;
  const bool v2_style = c.scoring_func == ScoringFunc::kSoftmax;
  g.scale = static_cast<float>(v2_style && c.norm_topk_prob ? 1.0 : c.routed_scaling_factor);
  return g;
}

void size_scratch(Scratch& s, const ModelConfig& c, const ModelOptions& o, int64_t key_block, int64_t max_pages) {
  const int64_t T = o.max_batch_tokens, H = c.num_attention_heads, h = c.hidden_size;
  const int64_t kvw = c.kv_lora_rank + c.qk_rope_head_dim;
  const int64_t ffn = std::max({c.intermediate_size, c.n_shared_experts * c.moe_intermediate_size, 2 * h});
  auto sz = [](int64_t n) { return static_cast<size_t>(std::max<int64_t>(n, 1)); };
  s.x.resize(sz(T * h));
  s.xn.resize(sz(T * h));
  s.q_a.resize(sz(T * c.q_lora_rank));
  s.q.resize(sz(T * H * c.qk_head_dim()));
  s.kv.resize(sz(T * kvw));
  s.attn_v.resize(sz(T * H * c.v_head_dim));
  s.ffn_a.resize(sz(T * ffn));
  s.ffn_b.resize(sz(T * ffn));
  s.router_logits.resize(sz(T * c.n_routed_experts));
  s.gate_w.resize(sz(T * c.num_experts_per_tok));
  s.gate_ids.resize(sz(T * c.num_experts_per_tok));
  s.positions.resize(sz(T));
  const int64_t entries = Model::absorbed_entries(o.max_sequences);
  const int64_t Td = std::min(T, entries * Model::kAbsorbThreshold);
  s.dq.resize(sz(Td * H * c.qk_head_dim()));
  s.dq_abs.resize(sz(Td * H * kvw));
  s.d_olat.resize(sz(Td * H * c.kv_lora_rank));
  s.d_lse.resize(sz(Td * H));
  s.d_out.resize(sz(Td * H * c.v_head_dim));
  s.block_tables.resize(sz(entries * max_pages));
  s.seqlens.resize(sz(entries));
  s.lat.resize(sz(key_block * kvw));
  s.k_nope.resize(sz(key_block * H * c.qk_nope_head_dim));
  s.v.resize(sz(key_block * H * c.v_head_dim));
  s.att_m.resize(sz(T * H));
  s.att_l.resize(sz(T * H));
  s.att_acc.resize(sz(T * H * c.v_head_dim));
  s.sel.resize(sz(T * h));
}

}  // namespace

Model::Model(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Model::~Model() = default;

Result<std::unique_ptr<Model>> Model::load(const std::string& path, const ModelOptions& options) {
  if (options.max_batch_tokens < 1 || options.max_sequences < 1) {
    return invalid_argument("max_batch_tokens and max_sequences must be positive");
  }
  if (options.ep_size <= 1) return load_local(path, options);
  // Expert parallelism: check the MPI world before touching the checkpoint, agree that every rank
  // loaded (so no rank waits in a collective for one that failed), then build the EP groups.
  ModelOptions o = options;
  o.ep_rank = TRY(ep_world_rank(options.ep_size));
  if (default_load_mode() == LoadMode::kRead) {
    log_warn(
        "--no-mmap under --ep {}: every rank reads the whole checkpoint into its own memory ({} copies); "
        "a mapping shares one page-cache copy and touches only this rank's experts",
        options.ep_size, options.ep_size);
  }
  auto model = load_local(path, o);
  TRY(ep_agree(model.ok() ? Status{} : model.status()));
  (*model)->impl_->ep = TRY(ep_moe_create((*model)->config(), o));
  return model;
}

Result<std::unique_ptr<Model>> Model::load_local(const std::string& path, const ModelOptions& options) {
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  LoadOptions lo;
  lo.load_mtp = options.load_mtp;
  lo.progress = options.progress;
  lo.ep_rank = options.ep_rank;
  lo.ep_size = options.ep_size;
  impl->w = TRY(load_weights(path, lo));
  const ModelConfig& c = impl->w->config;
  impl->tokenizer = TRY(load_tokenizer(*impl->w));
  if (impl->tokenizer->vocab_size() > c.vocab_size) {
    return invalid_argument("{}: the tokenizer has {} tokens but the model's vocabulary is {}", path,
                            impl->tokenizer->vocab_size(), c.vocab_size);
  }
  impl->max_context = options.max_context > 0 ? options.max_context : std::min<int64_t>(c.max_position_embeddings, 32768);
  if (impl->max_context > c.max_position_embeddings) {
    return invalid_argument("max context {} exceeds the model's max_position_embeddings {}", impl->max_context,
                            c.max_position_embeddings);
  }
  impl->rope = std::make_unique<RopeTable>(TRY(RopeTable::create(rope_params(c), impl->max_context)));
  impl->softmax_scale = static_cast<float>(c.softmax_scale());
  if (c.n_routed_experts > 0) {
    impl->gate = gate_params(c, nullptr);
    TRY(validate_moe_gate(impl->gate));
    impl->experts_params = {.n_experts = c.n_routed_experts, .hidden = c.hidden_size, .inter = c.moe_intermediate_size,
                            .top_k = static_cast<int>(c.num_experts_per_tok)};
    if (options.ep_size <= 1) impl->moe_ws = TRY(MoeWorkspace::create(impl->experts_params, options.max_batch_tokens));
    for (size_t l = 0; l < impl->w->layers.size(); ++l) {
      const LayerWeights& L = impl->w->layers[l];
      if (!L.moe) continue;
      Status st = validate_experts(impl->experts_params, L.experts);
      if (!st.ok()) return st.with_context(fmt::format("layer {}", l));
    }
  }
  impl->fingerprint = kv_model_fingerprint(hf_config_json(c).dump(), impl->w->weights_digest);
  const int64_t max_pages = (impl->max_context + 63) / 64;
  size_scratch(impl->s, c, options, impl->key_block, max_pages);
  impl->expert_used.assign(static_cast<size_t>(std::max<int64_t>(c.n_routed_experts, 1)), 0);
  return std::unique_ptr<Model>(new Model(std::move(impl)));
}

const ModelConfig& Model::config() const { return impl_->w->config; }
const Tokenizer& Model::tokenizer() const { return *impl_->tokenizer; }
const ModelOptions& Model::options() const { return impl_->options; }
int64_t Model::max_context() const { return impl_->max_context; }
const ModelFingerprint& Model::fingerprint() const { return impl_->fingerprint; }
bool Model::has_mtp() const { return impl_->w->n_mtp_layers > 0; }
bool Model::attention_in_bf16() const {
  return fathom::attention_in_bf16(impl_->w->layers[0]);
}
uint64_t Model::checkpoint_bytes() const { return impl_->w->checkpoint_bytes; }
uint64_t Model::repacked_bytes() const { return impl_->w->repacked_bytes; }
const ModelWeights& Model::weights() const { return *impl_->w; }

KvCacheOptions Model::kv_cache_options(MlaKvDType dtype, uint64_t capacity_bytes, int max_sequences) const {
  const ModelConfig& c = config();
  KvCacheOptions o;
  o.n_layers = static_cast<int>(c.num_hidden_layers + impl_->w->n_mtp_layers);
  o.format.d_latent = static_cast<int>(c.kv_lora_rank);
  o.format.d_rope = static_cast<int>(c.qk_rope_head_dim);
  o.format.dtype = dtype;
  o.format.page_tokens = 64;
  o.model_fingerprint = impl_->fingerprint;
  o.capacity_bytes = capacity_bytes;
  o.max_sequences = max_sequences;
  o.max_tokens_per_sequence = impl_->max_context;
  return o;
}

Status Model::Impl::check_batch(std::span<const SeqBatch> batch, size_t n_tokens, const KvCache& cache, bool mtp) const {
  if (batch.empty()) return invalid_argument("forward: empty batch");
  if (static_cast<int64_t>(batch.size()) > options.max_sequences) {
    return out_of_range("forward: {} sequences exceed max_sequences {}", batch.size(), options.max_sequences);
  }
  if (cache.format().d_latent != w->config.kv_lora_rank || cache.format().d_rope != w->config.qk_rope_head_dim ||
      cache.n_layers() < static_cast<int>(w->config.num_hidden_layers + (mtp ? 1 : 0))) {
    return invalid_argument("forward: the KV cache was not made for this model (see Model::kv_cache_options)");
  }
  int64_t total = 0;
  std::set<SeqId> seen;
  for (const SeqBatch& b : batch) {
    if (b.n_new < 1) return invalid_argument("forward: sequence {} has no new tokens", b.seq);
    if (!seen.insert(b.seq).second) return invalid_argument("forward: sequence {} appears twice in a batch", b.seq);
    if (b.pos < 0 || b.pos + b.n_new > max_context) {
      return out_of_range("forward: positions {}..{} of sequence {} exceed the context limit of {} tokens", b.pos,
                          b.pos + b.n_new - 1, b.seq, max_context);
    }
    const int64_t len = TRY(cache.seq_len(b.seq));
    if (mtp ? len < b.pos + b.n_new : len != b.pos + b.n_new) {
      return failed_precondition("forward: sequence {} holds {} tokens in the cache; positions {}..{} were requested "
                                 "(append the new tokens first)",
                                 b.seq, len, b.pos, b.pos + b.n_new - 1);
    }
    total += b.n_new;
  }
  if (total != static_cast<int64_t>(n_tokens)) {
    return invalid_argument("forward: the batch has {} new tokens but {} token ids were given", total, n_tokens);
  }
  if (total > options.max_batch_tokens) {
    return out_of_range("forward: {} tokens exceed max_batch_tokens {}", total, options.max_batch_tokens);
  }
  return {};
}

void Model::Impl::embed(std::span<const int32_t> tokens, float* out) const {
  const int64_t h = w->config.hidden_size;
  default_pool().parallel_for(static_cast<int64_t>(tokens.size()), 4, [&](int64_t b, int64_t e, int) {
    for (int64_t t = b; t < e; ++t) dequantize_weight_row(w->embed, tokens[static_cast<size_t>(t)], out + t * h);
  });
}

// Each routed expert the batch uses is read once; each (token, expert) pair costs 3 matmuls.
void Model::Impl::count_experts(const LayerWeights& L, int64_t T) {
  const int64_t k = w->config.num_experts_per_tok;
  std::fill(expert_used.begin(), expert_used.end(), 0);
  for (int64_t i = 0; i < T * k; ++i) {
    const int32_t e = s.gate_ids[static_cast<size_t>(i)];
    if (e < 0) continue;
    const ExpertWeights& ex = L.experts[static_cast<size_t>(e)];
    stats.linear_flops += 2.0 * static_cast<double>(ex.gate.rows * ex.gate.cols * 2 + ex.down.rows * ex.down.cols);
    if (expert_used[static_cast<size_t>(e)]++ == 0 && ex.gate.data != nullptr) {
      stats.experts_read += 1;
      stats.weight_bytes += static_cast<double>(dtype_bytes(ex.gate.dtype, static_cast<uint64_t>(ex.gate.rows * ex.gate.cols)) * 2 +
                                                dtype_bytes(ex.down.dtype, static_cast<uint64_t>(ex.down.rows * ex.down.cols)));
    }
  }
}

// Records the gate's choices, or replaces them with recorded ones and recomputes their weights
// exactly as the gate would (scores, normalisation, scale).
void Model::Impl::trace_routing(int64_t T) {
  const int64_t k = gate.top_k, E = gate.n_experts;
  for (int64_t t = 0; t < T; ++t) {
    const auto key = std::make_pair(current_layer, s.positions[static_cast<size_t>(t)]);
    int32_t* ids = s.gate_ids.data() + t * k;
    if (!trace->replay) {
      trace->ids[key].assign(ids, ids + k);
      continue;
    }
    auto it = trace->ids.find(key);
    if (it == trace->ids.end()) continue;
    std::vector<float> scores(static_cast<size_t>(E));
    const float* logit = s.router_logits.data() + t * E;
    if (gate.scoring == MoeScoring::kSigmoid) {
      for (int64_t e = 0; e < E; ++e) scores[static_cast<size_t>(e)] = 1.0f / (1.0f + std::exp(-logit[e]));
    } else {
      const float mx = *std::max_element(logit, logit + E);
      float sum = 0;
      for (int64_t e = 0; e < E; ++e) sum += scores[static_cast<size_t>(e)] = std::exp(logit[e] - mx);
      for (auto& v : scores) v /= sum;
    }
    float total = 0;
    for (int64_t j = 0; j < k; ++j) total += scores[static_cast<size_t>(it->second[static_cast<size_t>(j)])];
    for (int64_t j = 0; j < k; ++j) {
      ids[j] = it->second[static_cast<size_t>(j)];
      const float sc = scores[static_cast<size_t>(ids[j])];
      s.gate_w[static_cast<size_t>(t * k + j)] = (gate.normalize ? sc / (total + 1e-20f) : sc) * gate.scale;
    }
  }
}

void Model::set_routing_trace(RoutingTrace* trace) { impl_->trace = trace; }

Status Model::Impl::ffn(const LayerWeights& L, int64_t T) {
  const ModelConfig& c = w->config;
  ThreadPool& pool = default_pool();
  auto swiglu = [&](const WeightView& g, const WeightView& u, const WeightView& d) {
    const int64_t inter = g.rows;
    mm(g, s.xn.data(), T, s.ffn_a.data());
    mm(u, s.xn.data(), T, s.ffn_b.data());
    silu_mul(s.ffn_a.data(), s.ffn_b.data(), s.ffn_a.data(), T * inter);
    mm(d, s.ffn_a.data(), T, s.x.data(), {.accumulate = true});
  };
  if (!L.moe) {
    swiglu(L.mlp_gate, L.mlp_up, L.mlp_down);
    return {};
  }
  mm(L.router, s.xn.data(), T, s.router_logits.data());
  MoeGateParams g = gate;
  g.bias = L.router_bias.empty() ? nullptr : L.router_bias.data();
  moe_gate(g, s.router_logits.data(), T, s.gate_ids.data(), s.gate_w.data());
  if (trace != nullptr) trace_routing(T);
  count_experts(L, T);
  if (ep) return ffn_ep(L, T);
  moe_experts(experts_params, L.experts, s.xn.data(), T, s.gate_ids.data(), s.gate_w.data(), s.x.data(),
              /*accumulate=*/true, *moe_ws, pool);
  if (c.n_shared_experts > 0) swiglu(L.sh_gate, L.sh_up, L.sh_down);
  return {};
}

void Model::Impl::attn_norm(const LayerWeights& L, int64_t T) {
  rms_norm({.n_rows = T,
            .dim = w->config.hidden_size,
            .eps = static_cast<float>(w->config.rms_norm_eps),
            .weight_dtype = L.attn_norm.dtype},
           s.x.data(), L.attn_norm.data, s.xn.data(), default_pool());
}

Status Model::Impl::layer_forward(int64_t layer, std::span<const SeqBatch> batch, int64_t T, KvCache& cache) {
  const ModelConfig& c = w->config;
  const LayerWeights& L = w->layers[static_cast<size_t>(layer)];
  ThreadPool& pool = default_pool();
  const float eps = static_cast<float>(c.rms_norm_eps);
  attn_norm(L, T);
  current_layer = layer;
  TRY(attention(layer, batch, T, cache));
  mm(L.o, s.attn_v.data(), T, s.x.data(), {.accumulate = true});
  rms_norm({.n_rows = T, .dim = c.hidden_size, .eps = eps, .weight_dtype = L.ffn_norm.dtype}, s.x.data(),
           L.ffn_norm.data, s.xn.data(), pool);
  return ffn(L, T);
}

int64_t Model::Impl::select_rows(std::span<const SeqBatch> batch, const float* src, float* dst) const {
  const int64_t h = w->config.hidden_size;
  int64_t row = 0, n = 0;
  for (const SeqBatch& b : batch) {
    const int64_t first = b.all_logits ? 0 : b.n_new - 1;
    for (int64_t i = first; i < b.n_new; ++i) {
      std::memcpy(dst + n * h, src + (row + i) * h, static_cast<size_t>(h) * 4);
      ++n;
    }
    row += b.n_new;
  }
  return n;
}

Result<ForwardResult> Model::forward(std::span<const SeqBatch> batch, std::span<const int32_t> tokens, KvCache& cache,
                                     float* logits, float* hidden_all) {
  Impl& m = *impl_;
  const ModelConfig& c = m.w->config;
  TRY(m.check_batch(batch, tokens.size(), cache, false));
  for (int32_t t : tokens) {
    if (t < 0 || t >= c.vocab_size) return out_of_range("forward: token id {} is outside the vocabulary of {}", t, c.vocab_size);
  }
  const int64_t T = static_cast<int64_t>(tokens.size());
  m.stats = {};
  m.stats.weight_bytes += static_cast<double>(T) * static_cast<double>(dtype_bytes(m.w->embed.dtype, static_cast<uint64_t>(c.hidden_size)));
  int64_t row = 0;
  for (const SeqBatch& b : batch) {
    for (int64_t i = 0; i < b.n_new; ++i) m.s.positions[static_cast<size_t>(row++)] = b.pos + i;
  }
  m.embed(tokens, m.s.x.data());
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    Status st = m.layer_forward(l, batch, T, cache);
    if (!st.ok()) return st.with_context(fmt::format("layer {}", l));
  }
  ThreadPool& pool = default_pool();
  const RmsNormParams final_norm{.n_rows = T, .dim = c.hidden_size, .eps = static_cast<float>(c.rms_norm_eps),
                                 .weight_dtype = m.w->final_norm.dtype};
  if (hidden_all != nullptr) rms_norm(final_norm, m.s.x.data(), m.w->final_norm.data, hidden_all, pool);
  const int64_t n = m.select_rows(batch, m.s.x.data(), m.s.sel.data());
  rms_norm({.n_rows = n, .dim = c.hidden_size, .eps = static_cast<float>(c.rms_norm_eps),
            .weight_dtype = m.w->final_norm.dtype},
           m.s.sel.data(), m.w->final_norm.data, m.s.sel.data(), pool);
  m.mm(m.w->head, m.s.sel.data(), n, logits);
  return ForwardResult{n, m.stats};
}

Result<ForwardResult> Model::mtp_forward(std::span<const SeqBatch> batch, std::span<const int32_t> next_tokens,
                                         const float* prev_hidden, KvCache& cache, float* logits) {
  Impl& m = *impl_;
  const ModelConfig& c = m.w->config;
  if (!has_mtp()) return failed_precondition("this checkpoint has no MTP module");
  TRY(m.check_batch(batch, next_tokens.size(), cache, true));
  const int64_t T = static_cast<int64_t>(next_tokens.size()), h = c.hidden_size;
  const int64_t layer = c.num_hidden_layers;
  const LayerWeights& L = m.w->layers[static_cast<size_t>(layer)];
  ThreadPool& pool = default_pool();
  const float eps = static_cast<float>(c.rms_norm_eps);
  m.stats = {};
  int64_t row = 0;
  for (const SeqBatch& b : batch) {
    for (int64_t i = 0; i < b.n_new; ++i) m.s.positions[static_cast<size_t>(row++)] = b.pos + i;
  }
  for (int32_t t : next_tokens) {
    if (t < 0 || t >= c.vocab_size) return out_of_range("mtp: token id {} is outside the vocabulary", t);
  }
  // cat = [enorm(embed(next)); hnorm(prev_hidden)] -> eh_proj -> one decoder layer.
  m.embed(next_tokens, m.s.xn.data());
  float* cat = m.s.ffn_b.data();
  rms_norm({.n_rows = T, .dim = h, .eps = eps, .y_stride = 2 * h, .weight_dtype = L.enorm.dtype}, m.s.xn.data(),
           L.enorm.data, cat, pool);
  rms_norm({.n_rows = T, .dim = h, .eps = eps, .y_stride = 2 * h, .weight_dtype = L.hnorm.dtype}, prev_hidden,
           L.hnorm.data, cat + h, pool);
  m.mm(L.eh_proj, cat, T, m.s.x.data());
  if (logits == nullptr) {  // no drafts wanted: the layer's cache entries only
    Status st = m.write_kv(layer, batch, T, cache);
    if (!st.ok()) return st.with_context("MTP layer");
    return ForwardResult{0, m.stats};
  }
  Status st = m.layer_forward(layer, batch, T, cache);
  if (!st.ok()) return st.with_context("MTP layer");
  const int64_t n = m.select_rows(batch, m.s.x.data(), m.s.sel.data());
  rms_norm({.n_rows = n, .dim = h, .eps = eps, .weight_dtype = L.head_norm.dtype}, m.s.sel.data(), L.head_norm.data,
           m.s.sel.data(), pool);
  m.mm(m.w->head, m.s.sel.data(), n, logits);
  return ForwardResult{n, m.stats};
}

Result<std::vector<float>> run_sequence_logits(Model& model, std::span<const int32_t> tokens, RunMode mode,
                                               MlaKvDType kv_dtype) {
  const int64_t n = static_cast<int64_t>(tokens.size());
  if (n == 0) return invalid_argument("no tokens");
  const ModelConfig& c = model.config();
  KvCacheOptions ko = model.kv_cache_options(kv_dtype, 0, 1);
  const int64_t pages = (n + ko.format.page_tokens - 1) / ko.format.page_tokens + 1;
  ko.capacity_bytes = static_cast<uint64_t>(pages * ko.format.page_bytes() * ko.n_layers);
  auto cache = TRY(KvCache::create(ko));
  const SeqId seq = TRY(cache->add_sequence());
  std::vector<float> logits(static_cast<size_t>(n * c.vocab_size));
  const int64_t chunk = mode == RunMode::kPrefill ? model.options().max_batch_tokens : 1;
  for (int64_t p = 0; p < n; p += chunk) {
    const int64_t k = std::min(chunk, n - p);
    const auto span = tokens.subspan(static_cast<size_t>(p), static_cast<size_t>(k));
    TRY(cache->append(seq, span));
    const SeqBatch b{seq, p, k, true};
    TRY(model.forward(std::span<const SeqBatch>(&b, 1), span, *cache, logits.data() + p * c.vocab_size));
  }
  return logits;
}

}  // namespace fathom
