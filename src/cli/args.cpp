// Args implementation and the shared --help layout.
#include "cli/args.h"

#include <cstdio>
#include <cstdlib>

#include "base/cpu.h"
#include "base/mmap.h"
#include "base/log.h"
#include "base/strings.h"
#include "base/thread_pool.h"

namespace fathom::cli {

Args::Args(std::string command, std::string summary)
    : command_(std::move(command)), summary_(std::move(summary)) {
  option("--threads", &threads_, "worker threads (default: FATHOM_THREADS or all CPUs)");
  option("--simd", &simd_, "cap the SIMD level: scalar|avx2|avx512|avx512bf16", "LEVEL");
  option("--log-level", &log_level_, "debug|info|warn|error|off (default: FATHOM_LOG or info)", "LEVEL");
  // The common options print after the command's own ones: remember where they end.
}

void Args::add(Spec spec) {
  for (auto& s : specs_) {
    if (s.name == spec.name) {
      s = std::move(spec);
      return;
    }
  }
  specs_.push_back(std::move(spec));
}

Args::Spec* Args::find(const std::string& name) {
  for (auto& s : specs_) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

void Args::flag(std::string name, bool* out, std::string help) {
  add(Spec{name, std::move(help), "", "", false, [out](const std::string&) {
             *out = true;
             return Status();
           }});
}

void Args::option(std::string name, std::string* out, std::string help, std::string metavar) {
  add(Spec{name, std::move(help), std::move(metavar), out->empty() ? "" : *out, true,
           [out](const std::string& v) {
             *out = v;
             return Status();
           }});
}

void Args::option(std::string name, int64_t* out, std::string help, std::string metavar) {
  add(Spec{name, std::move(help), std::move(metavar), std::to_string(*out), true,
           [out, name](const std::string& v) -> Status {
             *out = TRY(parse_int(v, name));
             return {};
           }});
}

void Args::option(std::string name, int* out, std::string help, std::string metavar) {
  add(Spec{name, std::move(help), std::move(metavar), *out ? std::to_string(*out) : "", true,
           [out, name](const std::string& v) -> Status {
             const int64_t x = TRY(parse_int(v, name));
             if (x < -(int64_t{1} << 31) || x >= (int64_t{1} << 31)) return out_of_range("{}: {} is too large", name, v);
             *out = static_cast<int>(x);
             return {};
           }});
}

void Args::option(std::string name, double* out, std::string help, std::string metavar) {
  add(Spec{name, std::move(help), std::move(metavar), fmt::format("{}", *out), true,
           [out, name](const std::string& v) -> Status {
             *out = TRY(parse_double(v, name));
             return {};
           }});
}

void Args::option(std::string name, std::optional<std::string>* out, std::string help, std::string metavar) {
  add(Spec{name, std::move(help), std::move(metavar), "", true, [out](const std::string& v) {
             *out = v;
             return Status();
           }});
}

void Args::option(std::string name, std::optional<int64_t>* out, std::string help, std::string metavar) {
  add(Spec{name, std::move(help), std::move(metavar), "", true, [out, name](const std::string& v) -> Status {
             *out = TRY(parse_int(v, name));
             return {};
           }});
}

void Args::option(std::string name, std::optional<double>* out, std::string help, std::string metavar) {
  add(Spec{name, std::move(help), std::move(metavar), "", true, [out, name](const std::string& v) -> Status {
             *out = TRY(parse_double(v, name));
             return {};
           }});
}

void Args::multi(std::string name, std::vector<std::string>* out, std::string help, std::string metavar) {
  add(Spec{name, std::move(help) + " (repeatable)", std::move(metavar), "", true,
           [out](const std::string& v) {
             out->push_back(v);
             return Status();
           }});
}

void Args::positional(std::string name, std::string* out, std::string help, bool required) {
  positionals_.push_back(Positional{std::move(name), std::move(help), required, out});
}

void Args::rest(std::string name, std::vector<std::string>* out, std::string help) {
  rest_name_ = std::move(name);
  rest_help_ = std::move(help);
  rest_ = out;
}

bool Args::given(const std::string& name) const {
  for (const auto& g : given_) {
    if (g == name) return true;
  }
  return false;
}

Result<bool> Args::parse(int argc, char** argv) {
  size_t next_positional = 0;
  bool only_positional = false;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (!only_positional && arg == "--") {
      only_positional = true;
      continue;
    }
    if (!only_positional && (arg == "--help" || arg == "-h")) {
      std::fputs(help().c_str(), stdout);
      return false;
    }
    if (!only_positional && arg.size() > 2 && arg.compare(0, 2, "--") == 0) {
      std::string name = arg, value;
      bool has_value = false;
      if (auto eq = arg.find('='); eq != std::string::npos) {
        name = arg.substr(0, eq);
        value = arg.substr(eq + 1);
        has_value = true;
      }
      Spec* spec = find(name);
      if (spec == nullptr) {
        return invalid_argument("unknown option '{}' for '{}' (see {} --help)", name, command_, command_);
      }
      if (spec->takes_value && !has_value) {
        if (i + 1 >= argc) return invalid_argument("option '{}' needs a value ({})", name, spec->metavar);
        value = argv[++i];
      } else if (!spec->takes_value && has_value) {
        return invalid_argument("option '{}' takes no value", name);
      }
      TRY(spec->set(value));
      given_.push_back(name);
      continue;
    }
    if (next_positional < positionals_.size()) {
      *positionals_[next_positional++].out = arg;
    } else if (rest_ != nullptr) {
      rest_->push_back(arg);
    } else {
      return invalid_argument("unexpected argument '{}' for '{}' (see {} --help)", arg, command_, command_);
    }
  }
  for (size_t p = next_positional; p < positionals_.size(); ++p) {
    if (positionals_[p].required) {
      return invalid_argument("'{}' needs {} (see {} --help)", command_, positionals_[p].name, command_);
    }
  }
  if (!log_level_.empty()) set_log_level(TRY(parse_log_level(log_level_)));
  if (!simd_.empty()) set_simd_level_cap(TRY(parse_simd_level(simd_)));
  if (threads_ < 0 || threads_ > 1024) return invalid_argument("--threads {} is out of range (1..1024)", threads_);
  if (threads_ > 0) set_default_pool_threads(threads_);
  if (no_mmap_) set_default_load_mode(LoadMode::kRead);
  return true;
}

void Args::model_load_options() {
  flag(
      "--no-mmap", &no_mmap_,
      "read the model files into memory instead of mapping them (RAM for all of it; tensors on cache lines)");
}

std::string Args::help() const {
  std::string out = fmt::format("usage: {} {}\n\n{}\n", command_, usage_.empty() ? "[options]" : usage_, summary_);
  if (!positionals_.empty() || rest_ != nullptr) {
    out += "\narguments:\n";
    for (const auto& p : positionals_) out += fmt::format("  {:<26} {}\n", p.name, p.help);
    if (rest_ != nullptr) out += fmt::format("  {:<26} {}\n", rest_name_ + "...", rest_help_);
  }
  auto print_spec = [&](const Spec& s) {
    std::string left = s.name + (s.takes_value ? " " + s.metavar : "");
    std::string help = s.help;
    if (!s.default_text.empty() && s.takes_value && s.default_text != "0") help += fmt::format(" [{}]", s.default_text);
    out += fmt::format("  {:<26} {}\n", left, help);
  };
  out += "\noptions:\n";
  for (size_t i = 3; i < specs_.size(); ++i) print_spec(specs_[i]);
  out += "\ncommon options:\n";
  for (size_t i = 0; i < 3 && i < specs_.size(); ++i) print_spec(specs_[i]);
  out += fmt::format("  {:<26} {}\n", "-h, --help", "show this help");
  if (!epilog_.empty()) out += "\n" + epilog_ + "\n";
  return out;
}

bool is_primary_rank() {
  for (const char* var : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"}) {
    if (const char* v = std::getenv(var)) return std::atoi(v) == 0;
  }
  return true;
}

void print_json_line(const std::string& json) {
  if (!is_primary_rank()) return;
  std::fflush(stderr);
  std::fwrite(json.data(), 1, json.size(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
}

void print_json_line(const nlohmann::json& j) {
  print_json_line(j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
}

void print_json_line(const nlohmann::ordered_json& j) {
  print_json_line(j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace));
}

}  // namespace fathom::cli
