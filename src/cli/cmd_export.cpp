// `fathom export`: a `fathom train` run directory to a Hugging Face (bf16 / fp8 / f32) or GGUF
// checkpoint the runtime loads (train/trainer.h export_model, through the synth writers).
#include <cstdio>
#include <nlohmann/json.hpp>

#include "base/progress.h"
#include "cli/args.h"
#include "cli/command.h"
#include "train/trainer.h"

namespace fathom::cli {
namespace {

int run_export(int argc, char** argv) {
  train::ExportOptions o;
  bool json_out = false;
  Args args(
      argv[0],
      "Export a `fathom train` run (RUN_DIR/checkpoint.bin + run.json) as a checkpoint `fathom serve`,\n"
      "`generate` and `chat` load: Hugging Face safetensors (bf16, or DeepSeek's FP8 e4m3 + "
      "weight_scale_inv\n"
      "per 128x128 block) with config.json and the data's tokenizer, or GGUF (llama.cpp deepseek2).");
  args.usage("--run RUN_DIR --out MODEL_DIR|FILE.gguf [--dtype bf16|fp8|f32] [--format hf|gguf]");
  args.option("--run", &o.run_dir, "the training run directory", "RUN_DIR");
  args.option("--out", &o.out, "output directory (hf) or .gguf file", "PATH");
  args.option("--dtype", &o.dtype, "hf: bf16|fp8|f32; gguf: bf16|f16|f32|q8_0", "DTYPE");
  args.option("--format", &o.format, "hf or gguf", "FORMAT");
  args.option("--tokenizer", &o.tokenizer_dir, "directory with tokenizer.json (default: the run's data dir)",
              "DIR");
  args.flag("--json", &json_out, "print one JSON summary line");
  auto parsed = args.parse(argc, argv);
  if (!parsed.ok()) return fail(args.command(), parsed.status());
  if (!*parsed) return 0;
  if (o.run_dir.empty()) return fail(args.command(), invalid_argument("--run is required"));
  auto r = train::export_model(o);
  if (!r.ok()) return fail(args.command(), r.status());
  if (json_out) {
    print_json_line(nlohmann::json{
        {"out", o.out}, {"format", o.format}, {"dtype", o.dtype}, {"files", r->files}, {"bytes", r->bytes}}
                        .dump());
  } else {
    std::printf("exported %s to %s (%s, %s): %zu file(s), %s\n", o.run_dir.c_str(), o.out.c_str(),
                o.format.c_str(), o.dtype.c_str(), r->files.size(), format_bytes(r->bytes).c_str());
  }
  return 0;
}

}  // namespace

FATHOM_COMMAND("export", "export a `fathom train` run as a Hugging Face (bf16/fp8) or GGUF checkpoint",
               run_export);

}  // namespace fathom::cli
