// `fathom serve`: the OpenAI-compatible server over a model (engine + HTTP).
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <thread>

#include <nlohmann/json.hpp>

#include "base/fs.h"
#include "base/log.h"
#include "base/strings.h"
#include "cli/args.h"
#include "cli/command.h"
#include "engine/engine.h"
#include "model/model.h"
#include "server/server.h"

namespace fathom::cli {
namespace {

Server* g_server = nullptr;

void on_signal(int) {
  if (g_server) g_server->stop();
}

std::string default_model_name(const std::string& path) {
  std::filesystem::path p(path);
  while (!p.empty() && p.filename().empty()) p = p.parent_path();
  std::string name = p.filename().string();
  if (ends_with(name, ".gguf")) name.resize(name.size() - 5);
  return name.empty() ? "model" : name;
}

// --test-outputs FILE: a JSON array of strings, the outputs forced on successive chat completions.
Result<std::vector<std::string>> read_test_outputs(const std::string& path) {
  const std::string text = TRY(read_file(path));
  const auto j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_array()) return invalid_argument("{}: expected a JSON array of strings", path);
  std::vector<std::string> out;
  for (size_t i = 0; i < j.size(); ++i) {
    if (!j[i].is_string()) return invalid_argument("{}: element {} is not a string", path, i);
    out.push_back(j[i].get<std::string>());
  }
  return out;
}

int run_serve(int argc, char** argv) {
  std::string model_path, kv_dtype = "bf16";
  ServerOptions so;
  EngineOptions eo;
  double kv_gb = 1.0;
  int64_t max_context = 0, max_body_mb = 4, kv_store_queue_mb = 64;
  bool no_spec = false, no_prefix = false, spec_always = false;
  Args args(argv[0], "Serve a model over an OpenAI-compatible HTTP API (chat/completions, completions, models,\n"
                     "health, metrics) with continuous batching, prefix caching and MTP speculation.");
  args.usage("--model PATH [options]");
  args.option("--model", &model_path, "Hugging Face model directory or GGUF file", "PATH");
  args.model_load_options();
  args.option("--host", &so.host, "address to listen on", "HOST");
  args.option("--port", &so.port, "port (0 picks a free one)");
  args.option("--served-model-name", &so.served_model_name, "model id in the API (default: the checkpoint's name)", "NAME");
  args.option("--api-key", &so.api_key, "require 'Authorization: Bearer KEY' on every route but /health", "KEY");
  args.option("--max-batch", &eo.max_running, "sequences decoding at once");
  args.option("--prefill-chunk", &eo.prefill_chunk, "prefill tokens per step (chunked prefill)");
  args.option("--prefill-chunk-idle", &eo.prefill_chunk_idle,
              "prefill tokens per step while no stream is decoding (0: --prefill-chunk)");
  args.option("--max-waiting", &eo.max_waiting, "queued requests before 429");
  args.option("--kv-cache-gb", &kv_gb, "KV cache capacity in GiB");
  args.option("--kv-dtype", &kv_dtype, "bf16 or fp8 latent cache", "DTYPE");
  args.option("--max-context", &max_context, "context limit (default min(max_position_embeddings, 32768))");
  args.option("--max-body-mb", &max_body_mb, "largest request body (413 beyond)");
  args.option("--http-threads", &so.http_threads, "concurrent HTTP connections served");
  args.option("--kv-store", &eo.kv_store.server,
              "write KV pages through to a `fathom store server` and read prompt prefixes back from it", "HOST:PORT");
  args.option("--kv-store-queue-mb", &kv_store_queue_mb, "KV pages waiting to be written to the store, in MiB");
  args.option("--kv-store-timeout-ms", &eo.kv_store.io_timeout_ms, "a store call taking longer counts as a failure");
  args.flag("--no-speculative", &no_spec, "do not use the MTP module for speculative decoding");
  args.flag("--speculation-always", &spec_always,
            "draft every step (default: only while steps with drafts measure faster than without)");
  args.flag("--no-prefix-cache", &no_prefix, "do not reuse cached prompt pages");
  bool no_tool_constraint = false;
  args.flag("--no-tool-name-constraint", &no_tool_constraint,
            "decode tool calls unconstrained (default: a call names an offered tool and its arguments are "
            "one JSON object with that tool's parameter keys)");
  std::string name_selection{tool_name_selection_name(so.tool_name_selection)};
  args.option("--tool-name-selection", &name_selection,
              "how a call's name is picked among the offered tools: 'whole' (each tool's call head - its "
              "name and first argument key - scored by the model, the likeliest taken) or 'tokens' (token "
              "by token under the name mask)",
              "whole|tokens");
  args.option("--tool-head-weight", &so.tool_head_weight,
              "with 'whole': a head's score is log p(name) + W * log p(its fence and first key | name); "
              "1 scores the head's joint probability, 0 the name alone",
              "W");
  args.flag("--enable-test-hooks", &so.enable_test_hooks, "testing only: honour \"fathom_test_output\" in requests");
  std::string test_outputs;
  args.option("--test-outputs", &test_outputs,
              "testing only: JSON array of texts forced, in order, on chat completions without "
              "\"fathom_test_output\" (implies --enable-test-hooks)",
              "FILE");
  auto parsed = args.parse(argc, argv);
  if (!parsed.ok()) return fail(args.command(), parsed.status());
  if (!*parsed) return 0;
  if (model_path.empty()) return fail(args.command(), invalid_argument("--model is required"));
  auto selection = parse_tool_name_selection(name_selection);
  if (!selection.ok())
    return fail(args.command(), invalid_argument("--tool-name-selection: {}", selection.status().message()));
  so.tool_name_selection = *selection;
  if (Status st = check_tool_head_weight(so.tool_head_weight); !st.ok())
    return fail(args.command(), invalid_argument("--tool-head-weight: {}", st.message()));
  if (!test_outputs.empty()) {
    auto outs = read_test_outputs(test_outputs);
    if (!outs.ok()) return fail(args.command(), outs.status());
    so.test_outputs = std::move(*outs);
    so.enable_test_hooks = true;
  }
  if (kv_gb <= 0 || kv_gb > 4096) return fail(args.command(), invalid_argument("--kv-cache-gb {} is out of range", kv_gb));
  if (max_body_mb < 1) return fail(args.command(), invalid_argument("--max-body-mb must be at least 1"));
  auto kvd = parse_mla_kv_dtype(kv_dtype);
  if (!kvd.ok()) return fail(args.command(), kvd.status());
  eo.kv_dtype = *kvd;
  if (kv_store_queue_mb < 1) return fail(args.command(), invalid_argument("--kv-store-queue-mb must be at least 1"));
  if (eo.kv_store.io_timeout_ms < 1) return fail(args.command(), invalid_argument("--kv-store-timeout-ms must be positive"));
  eo.kv_store.write_queue_bytes = static_cast<uint64_t>(kv_store_queue_mb) << 20;
  eo.kv_cache_bytes = static_cast<uint64_t>(kv_gb * static_cast<double>(uint64_t{1} << 30));
  eo.speculative = !no_spec;
  eo.speculative_adaptive = !spec_always;
  eo.prefix_cache = !no_prefix;
  so.constrain_tool_names = !no_tool_constraint;
  so.max_body_bytes = static_cast<size_t>(max_body_mb) << 20;
  if (so.served_model_name.empty()) so.served_model_name = default_model_name(model_path);
  ModelOptions mo;
  mo.max_context = max_context;
  // Without speculation the MTP layer's cache would never be written, so no page could be
  // published (no prefix cache, no store tier): leave the module out.
  mo.load_mtp = !no_spec;
  mo.max_sequences = eo.max_running + 1;
  mo.max_batch_tokens = engine_batch_tokens(eo);
  auto model = Model::load(model_path, mo);
  if (!model.ok()) return fail(args.command(), model.status());
  auto engine = Engine::create(**model, eo);
  if (!engine.ok()) return fail(args.command(), engine.status());
  auto server = Server::create(**engine, so);
  if (!server.ok()) return fail(args.command(), server.status());
  Status st = (*server)->bind();
  if (!st.ok()) return fail(args.command(), st);
  g_server = server->get();
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  std::signal(SIGPIPE, SIG_IGN);
  std::printf("fathom serve: listening on http://%s:%d (model '%s'%s)\n", so.host.c_str(), (*server)->port(),
              so.served_model_name.c_str(),
              !((*model)->has_mtp() && eo.speculative) ? ""
              : eo.speculative_adaptive                ? ", MTP speculation where it measures faster"
                                                       : ", MTP speculation on");
  if (!eo.kv_store.server.empty()) std::printf("fathom serve: KV store tier at %s\n", eo.kv_store.server.c_str());
  std::fflush(stdout);
  st = (*server)->serve();
  g_server = nullptr;
  log_info("server stopped");
  if (!st.ok()) return fail(args.command(), st);
  return 0;
}

}  // namespace

FATHOM_COMMAND("serve", "Serve a model over an OpenAI-compatible HTTP API", run_serve);

}  // namespace fathom::cli
