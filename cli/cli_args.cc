#include "cli/cli_args.h"

#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace trainctl::cli {
namespace {

const OptionSpec* Find(const std::vector<OptionSpec>& specs, const std::string& token) {
  for (const OptionSpec& spec : specs) {
    if (token == "--" + spec.name || (!spec.alias.empty() && token == spec.alias)) return &spec;
  }
  return nullptr;
}

}  // namespace

absl::StatusOr<ParsedArgs> ParseArgs(const std::vector<std::string>& args,
                                     const std::vector<OptionSpec>& specs, bool allow_passthrough) {
  ParsedArgs out;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg.size() < 2 || arg[0] != '-') {
      out.positional.push_back(arg);
      continue;
    }
    std::string token = arg;
    std::optional<std::string> value;
    if (auto eq = arg.find('='); eq != std::string::npos) {
      token = arg.substr(0, eq);
      value = arg.substr(eq + 1);
    }
    const OptionSpec* spec = Find(specs, token);
    if (spec == nullptr) {
      if (!allow_passthrough || !absl::StartsWith(arg, "--")) {
        return absl::InvalidArgumentError(absl::StrCat(token, ": unknown option"));
      }
      out.passthrough.push_back(arg);  // its value, if separate, follows as a plain argument
      if (!value && i + 1 < args.size() && !absl::StartsWith(args[i + 1], "--")) {
        out.passthrough.push_back(args[++i]);
      }
      continue;
    }
    if (!spec->takes_value) {
      out.options[spec->name] = value.value_or("true");
      continue;
    }
    if (!value) {
      if (i + 1 >= args.size())
        return absl::InvalidArgumentError(absl::StrCat(token, ": needs a value"));
      value = args[++i];
    }
    out.options[spec->name] = *value;
  }
  return out;
}

}  // namespace trainctl::cli
