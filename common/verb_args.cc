#include "common/verb_args.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace trainctl {
namespace {

const OptionSpec* Find(const std::vector<OptionSpec>& specs, const std::string& token) {
  for (const OptionSpec& spec : specs) {
    if (token == "--" + spec.name || (!spec.alias.empty() && token == spec.alias)) return &spec;
  }
  return nullptr;
}

// "--name=value" as ("--name", "value"); "--name" as ("--name", nullopt).
std::pair<std::string, std::optional<std::string>> SplitOption(const std::string& arg) {
  const size_t eq = arg.find('=');
  if (eq == std::string::npos) return {arg, std::nullopt};
  return {arg.substr(0, eq), arg.substr(eq + 1)};
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
    auto [token, value] = SplitOption(arg);
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
    if (!spec->takes_value) {  // a switch: --name, --name=true, or --name=false (off)
      if (value && *value != "true" && *value != "false") {
        return absl::InvalidArgumentError(absl::StrCat(
            token, ": a switch takes no value (or =true, =false), got '", *value, "'"));
      }
      if (value == "false") {
        out.options.erase(spec->name);
        out.values.erase(spec->name);
      } else {
        out.options[spec->name] = "true";
        out.values[spec->name] = {"true"};
      }
      continue;
    }
    if (!value) {
      if (i + 1 >= args.size())
        return absl::InvalidArgumentError(absl::StrCat(token, ": needs a value"));
      value = args[++i];
    }
    out.options[spec->name] = *value;
    out.values[spec->name].push_back(*value);
  }
  return out;
}

const std::vector<std::string>& ParsedArgs::GetAll(const std::string& name) const {
  static const auto* const kNone = new std::vector<std::string>();
  auto it = values.find(name);
  return it == values.end() ? *kNone : it->second;
}

absl::StatusOr<LeadingArgs> ParseLeadingOptions(const std::vector<std::string>& args,
                                                const std::vector<OptionSpec>& globals) {
  LeadingArgs out;
  size_t i = 0;
  while (i < args.size() && args[i].size() >= 2 && args[i][0] == '-') {
    const std::string& arg = args[i];
    auto [token, value] = SplitOption(arg);
    const OptionSpec* spec = Find(globals, token);
    if (spec == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(token,
                       ": unknown option before the command (only --coordinator and -o "
                       "may come before it)"));
    }
    if (spec->takes_value && !value) {
      if (i + 1 >= args.size())
        return absl::InvalidArgumentError(absl::StrCat(token, ": needs a value"));
      value = args[++i];
    }
    out.options[spec->name] = value.value_or("true");
    ++i;
  }
  out.verb_index = i;
  return out;
}

absl::Status MergeLeadingOptions(const LeadingArgs& leading, const std::vector<OptionSpec>& specs,
                                 ParsedArgs* parsed) {
  for (const auto& option : leading.options) {
    const std::string& name = option.first;
    const bool known = std::any_of(specs.begin(), specs.end(),
                                   [&](const OptionSpec& s) { return s.name == name; });
    if (!known) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", name, ": not an option of this command"));
    }
    // The verb's own value, if any, stays.
    if (parsed->options.emplace(name, option.second).second) {
      parsed->values[name] = {option.second};
    }
  }
  return absl::OkStatus();
}

}  // namespace trainctl
