#include "cli/tokenize_command.h"

#include <cstdint>
#include <iostream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cli/exit_codes.h"
#include "common/tokenizer/bpe_tokenizer.h"
#include "nlohmann/json.hpp"

namespace trainctl::cli {
namespace {

// Ids as a JSON array, or INVALID_ARGUMENT when `line` is not one.
absl::StatusOr<std::vector<int32_t>> ParseIds(const std::string& line) {
  const nlohmann::json ids = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  std::vector<int32_t> out;
  bool ok = ids.is_array();
  for (size_t i = 0; ok && i < ids.size(); ++i) {
    ok = ids[i].is_number_integer() && ids[i].get<int64_t>() >= INT32_MIN &&
         ids[i].get<int64_t>() <= INT32_MAX;
    if (ok) out.push_back(ids[i].get<int32_t>());
  }
  if (!ok) return absl::InvalidArgumentError("expected a JSON array of token ids");
  return out;
}

// One line of `trainctl tokenize`'s output for one line of its input.
absl::StatusOr<std::string> TokenizeLine(const tokenizer::BpeTokenizer& tokenizer,
                                         const std::string& line, bool decode) {
  if (!decode) {
    auto ids = tokenizer.Encode(line);
    if (!ids.ok()) return ids.status();
    return absl::StrCat("[", absl::StrJoin(*ids, ","), "]");
  }
  auto ids = ParseIds(line);
  if (!ids.ok()) return ids.status();
  return tokenizer.Decode(*ids);
}

}  // namespace

int RunTokenize(const ParsedArgs& args, std::ostream& out, std::ostream& err) {
  if (!args.Has("tokenizer")) {
    return Fail(err, absl::InvalidArgumentError("tokenize needs --tokenizer DIR"));
  }
  auto tokenizer = tokenizer::BpeTokenizer::Load(args.Get("tokenizer"));
  if (!tokenizer.ok()) return Fail(err, tokenizer.status());
  std::string line;
  for (int number = 1; std::getline(std::cin, line); ++number) {
    auto result = TokenizeLine(**tokenizer, line, args.Has("decode"));
    if (!result.ok()) {
      return Fail(err, absl::InvalidArgumentError(
                           absl::StrCat("stdin line ", number, ": ", result.status().message())));
    }
    out << *result << std::endl;
  }
  return kExitOk;
}

}  // namespace trainctl::cli
