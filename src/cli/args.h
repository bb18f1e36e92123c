// Args: the command-line parser every subcommand uses, so options, errors and --help look the
// same everywhere. Options are bound to variables that already hold their defaults:
//
//   SynthOptions o;                       // defaults live in the options struct
//   Args args("fathom synth", "Write a random-weight checkpoint.");
//   args.option("--preset", &o.preset, "tiny|v2-lite|v3", "NAME");
//   args.flag("--json", &o.json, "print one JSON object");
//   if (auto parsed = args.parse(argc, argv); !parsed.ok()) return fail(...);
//   else if (!*parsed) return 0;          // --help was printed
//
// Accepts "--name value" and "--name=value". Every command also takes --threads, --simd and
// --log-level, applied during parse.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"

namespace fathom::cli {

class Args {
 public:
  Args(std::string command, std::string summary);

  void usage(std::string text) { usage_ = std::move(text); }  // e.g. "[options] PATH"
  void epilog(std::string text) { epilog_ = std::move(text); }

  void flag(std::string name, bool* out, std::string help);
  void option(std::string name, std::string* out, std::string help, std::string metavar = "VALUE");
  void option(std::string name, int64_t* out, std::string help, std::string metavar = "N");
  void option(std::string name, int* out, std::string help, std::string metavar = "N");
  void option(std::string name, double* out, std::string help, std::string metavar = "X");
  void option(std::string name, std::optional<std::string>* out, std::string help, std::string metavar = "VALUE");
  void option(std::string name, std::optional<int64_t>* out, std::string help, std::string metavar = "N");
  void option(std::string name, std::optional<double>* out, std::string help, std::string metavar = "X");
  // Repeatable: every occurrence is appended.
  void multi(std::string name, std::vector<std::string>* out, std::string help, std::string metavar = "VALUE");
  void positional(std::string name, std::string* out, std::string help, bool required = true);
  void rest(std::string name, std::vector<std::string>* out, std::string help);

  // false when --help was printed (the caller exits 0); an error names the bad option.
  // --no-mmap, for commands that load a model: read its files into memory instead of mapping
  // them (MappedFile LoadMode::kRead), applied by parse().
  void model_load_options();

  Result<bool> parse(int argc, char** argv);
  bool given(const std::string& name) const;
  std::string help() const;
  const std::string& command() const { return command_; }

 private:
  struct Spec {
    std::string name;
    std::string help;
    std::string metavar;
    std::string default_text;
    bool takes_value = true;
    std::function<Status(const std::string&)> set;
  };
  struct Positional {
    std::string name;
    std::string help;
    bool required;
    std::string* out;
  };
  void add(Spec spec);
  Spec* find(const std::string& name);

  std::string command_, summary_, usage_, epilog_;
  std::vector<Spec> specs_;
  std::vector<Positional> positionals_;
  std::string rest_name_, rest_help_;
  std::vector<std::string>* rest_ = nullptr;
  std::vector<std::string> given_;
  int threads_ = 0;
  std::string simd_, log_level_;
  bool no_mmap_ = false;
};

// Under mpirun only rank 0 prints the --json line (OMPI_COMM_WORLD_RANK / PMI_RANK / PMIX_RANK).
bool is_primary_rank();
// Prints one single-line JSON object (already serialised) as the last line of stdout.
void print_json_line(const std::string& json);
// The same for a JSON value, serialised lossily: bytes that are not UTF-8 (GGUF strings, plugin
// output, file names) print as U+FFFD instead of aborting the command.
void print_json_line(const nlohmann::json& j);
void print_json_line(const nlohmann::ordered_json& j);

}  // namespace fathom::cli
