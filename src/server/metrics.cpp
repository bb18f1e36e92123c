// GET /metrics: Prometheus text exposition of the server's and the engine's counters.
#include <fmt/format.h>

#include "server/server_impl.h"

namespace fathom {
namespace {

void family(std::string& out, const char* name, const char* type, const char* help) {
  out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
}

void histogram(std::string& out, const char* name, const char* help, const Histogram& h) {
  family(out, name, "histogram", help);
  int64_t cum = 0;
  for (size_t i = 0; i < h.bounds.size(); ++i) {
    cum += h.counts[i];
    out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, h.bounds[i], cum);
  }
  cum += h.counts.back();
  out += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n{}_sum {}\n{}_count {}\n", name, cum, name, h.sum, name, h.count);
}

}  // namespace

std::string Server::Impl::metrics_text() {
  const EngineMetrics m = engine->metrics();
  std::string out;
  family(out, "fathom_requests_total", "counter", "HTTP requests by route and status code.");
  {
    std::lock_guard lock(mu);
    for (const auto& [key, n] : requests) {
      out += fmt::format("fathom_requests_total{{route=\"{}\",status=\"{}\"}} {}\n", key.first, key.second, n);
    }
  }
  auto counter = [&](const char* name, const char* help, int64_t v) {
    family(out, name, "counter", help);
    out += fmt::format("{} {}\n", name, v);
  };
  auto gauge = [&](const char* name, const char* help, double v) {
    family(out, name, "gauge", help);
    out += fmt::format("{} {}\n", name, v);
  };
  counter("fathom_prompt_tokens_total", "Prompt tokens of admitted requests.", m.prompt_tokens);
  counter("fathom_prompt_tokens_cached_total", "Prompt tokens served from the prefix cache.", m.cached_prompt_tokens);
  counter("fathom_generation_tokens_total", "Generated tokens.", m.generated_tokens);
  counter("fathom_requests_finished_total", "Requests that completed (stop or length).", m.requests_finished);
  counter("fathom_requests_cancelled_total", "Requests cancelled (client gone).", m.requests_cancelled);
  counter("fathom_requests_failed_total", "Requests that ended with an error.", m.requests_failed);
  counter("fathom_preemptions_total", "Sequences preempted to free KV pages (recomputed later).", m.preemptions);
  counter("fathom_engine_steps_total", "Engine steps (forward calls).", m.steps);
  counter("fathom_spec_decode_draft_tokens_total", "MTP draft tokens verified.", m.spec_drafted);
  counter("fathom_spec_decode_accepted_tokens_total", "MTP draft tokens accepted.", m.spec_accepted);
  counter("fathom_spec_decode_steps_drafting_total",
          "Decode steps after which the sequences drafted (MTP speculation where it measures faster).",
          m.spec_steps_drafting);
  counter("fathom_spec_decode_steps_plain_total", "Decode steps after which they did not draft.",
          m.spec_steps_plain);
  counter("fathom_tool_names_scored_total", "Tool-call names chosen by whole-name scoring.",
          m.tool_names_scored);
  counter("fathom_tool_names_unscored_total",
          "Tool-call names chosen token by token because whole-name scoring found no KV pages.",
          m.tool_names_unscored);
  gauge("fathom_spec_decode_acceptance_ratio", "Accepted / drafted MTP tokens.",
        m.spec_drafted ? static_cast<double>(m.spec_accepted) / static_cast<double>(m.spec_drafted) : 0.0);
  gauge("fathom_num_requests_running", "Sequences in the running batch.", static_cast<double>(m.running));
  gauge("fathom_num_requests_waiting", "Requests waiting for admission.", static_cast<double>(m.waiting));
  gauge("fathom_kv_cache_pages_total", "KV cache pages.", static_cast<double>(m.kv.pages_total));
  gauge("fathom_kv_cache_pages_used", "KV cache pages referenced by sequences.", static_cast<double>(m.kv.pages_used));
  gauge("fathom_kv_cache_pages_cached", "Unreferenced cached pages (prefix cache, evictable).", static_cast<double>(m.kv.pages_cached));
  gauge("fathom_kv_cache_usage_ratio", "Used / total KV pages.",
        m.kv.pages_total ? static_cast<double>(m.kv.pages_used) / static_cast<double>(m.kv.pages_total) : 0.0);
  counter("fathom_prefix_cache_hit_pages_total", "Pages attached from the prefix cache (store imports included).", m.kv.prefix_hit_pages);
  gauge("fathom_prefix_cache_hit_ratio", "Cached prompt tokens / prompt tokens.",
        m.prompt_tokens ? static_cast<double>(m.cached_prompt_tokens) / static_cast<double>(m.prompt_tokens) : 0.0);
  if (m.kv_store) {  // fathom serve --kv-store (engine/kv_tier.h)
    const KvTierStats& k = m.store;
    counter("fathom_kv_store_pages_written_total", "KV pages written through to the store.", k.pages_written);
    counter("fathom_kv_store_bytes_written_total", "Bytes of KV pages written to the store.", k.bytes_written);
    counter("fathom_kv_store_pages_read_total", "KV pages read back from the store.", k.pages_read);
    counter("fathom_kv_store_bytes_read_total", "Bytes of KV pages read back from the store.", k.bytes_read);
    counter("fathom_kv_store_lookups_total", "Prefix lookups sent to the store (prompts missing pages in memory).", k.lookups);
    counter("fathom_kv_store_hit_pages_total", "Looked-up pages the store had.", k.hit_pages);
    counter("fathom_kv_store_miss_pages_total", "Looked-up pages the store did not have.", k.miss_pages);
    counter("fathom_kv_store_imported_pages_total", "Store pages verified and imported into the memory cache.", k.pages_imported);
    counter("fathom_kv_store_import_errors_total", "Store pages rejected at import (bad blob: recomputed).", k.import_errors);
    counter("fathom_kv_store_errors_total", "Failed store connects, writes and reads (served by recompute).", k.errors);
    counter("fathom_kv_store_writes_dropped_total", "KV pages not written (store down, queue full, shutdown).", k.writes_dropped);
    gauge("fathom_kv_store_write_queue_pages", "KV pages waiting to be written.", static_cast<double>(k.write_queue_pages));
    gauge("fathom_kv_store_up", "1 when the last store call succeeded.", k.connected ? 1.0 : 0.0);
  }
  histogram(out, "fathom_time_to_first_token_seconds", "Time from request to first token.", m.ttft);
  histogram(out, "fathom_inter_token_latency_seconds", "Time between tokens of a stream.", m.itl);
  return out;
}

}  // namespace fathom
