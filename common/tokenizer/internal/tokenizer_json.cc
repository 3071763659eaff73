#include "common/tokenizer/internal/tokenizer_json.h"

#include <cctype>
#include <cstdint>
#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/tokenizer/internal/split_regex.h"

namespace trainctl::tokenizer::internal {
namespace {

using Json = nlohmann::json;

absl::Status Invalid(absl::string_view path, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", what));
}

// obj[key], or null when `obj` is not an object or lacks `key` (never a copy).
const Json& Field(const Json& obj, const char* key) {
  static const Json* const kNull = new Json();
  if (!obj.is_object()) return *kNull;
  auto it = obj.find(key);
  return it == obj.end() ? *kNull : *it;
}

// The string at `j`'s "type" key, or "" when absent / null.
std::string TypeOf(const Json& j) {
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string()) return "";
  return j["type"].get<std::string>();
}

bool FlagOr(const Json& obj, const char* key, bool fallback) {
  auto it = obj.find(key);
  return it != obj.end() && it->is_boolean() ? it->get<bool>() : fallback;
}

bool EmptyOrNull(const Json& obj, const char* key) {
  auto it = obj.find(key);
  return it == obj.end() || it->is_null() || (it->is_string() && it->get<std::string>().empty());
}

absl::StatusOr<bool> ParseNormalizer(const Json& n, const std::string& path) {
  if (n.is_null()) return false;
  const std::string type = TypeOf(n);
  if (type == "NFC") return true;
  const Json& list = Field(n, "normalizers");
  if (type == "Sequence" && list.is_array()) {
    bool nfc = false;
    for (size_t i = 0; i < list.size(); ++i) {
      auto inner = ParseNormalizer(list[i], absl::StrCat(path, ".normalizers[", i, "]"));
      if (!inner.ok()) return inner.status();
      nfc = nfc || *inner;
    }
    return nfc;
  }
  return Invalid(path, absl::StrCat("unsupported type '", type, "' (supported: NFC)"));
}

absl::Status CheckByteLevel(const Json& p, absl::string_view path, bool want_regex) {
  if (FlagOr(p, "add_prefix_space", false))
    return Invalid(path, "add_prefix_space is not supported");
  if (FlagOr(p, "use_regex", true) != want_regex) {
    return Invalid(path, want_regex ? "use_regex: false needs a Split before it"
                                    : "use_regex must be false after a Split");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ParseSplit(const Json& s, absl::string_view path) {
  if (s.value("behavior", "") != "Isolated" || FlagOr(s, "invert", false)) {
    return Invalid(path, "only behavior Isolated without invert is supported");
  }
  const Json& regex = Field(Field(s, "pattern"), "Regex");
  const Json& string = Field(Field(s, "pattern"), "String");
  if (regex.is_string()) return regex.get<std::string>();
  if (string.is_string()) {
    std::string literal;
    for (const char c : string.get<std::string>()) {
      if (!std::isalnum(static_cast<unsigned char>(c)) && !(static_cast<unsigned char>(c) & 0x80)) {
        literal.push_back('\\');
      }
      literal.push_back(c);
    }
    return literal;
  }
  return Invalid(absl::StrCat(path, ".pattern"), "needs a Regex or String");
}

// The split pattern: Sequence[Split, ByteLevel(use_regex false)] or ByteLevel(use_regex true).
absl::StatusOr<std::string> ParsePreTokenizer(const Json& p) {
  const std::string type = TypeOf(p);
  if (type == "ByteLevel") {
    if (auto s = CheckByteLevel(p, "pre_tokenizer", true); !s.ok()) return s;
    return std::string(kGpt2SplitPattern);
  }
  const Json& list = Field(p, "pretokenizers");
  if (type != "Sequence" || !list.is_array() || list.size() != 2 || TypeOf(list[0]) != "Split" ||
      TypeOf(list[1]) != "ByteLevel") {
    return Invalid("pre_tokenizer", "supported: ByteLevel, or Sequence [Split, ByteLevel]");
  }
  if (auto s = CheckByteLevel(list[1], "pre_tokenizer.pretokenizers[1]", false); !s.ok()) return s;
  return ParseSplit(list[0], "pre_tokenizer.pretokenizers[0]");
}

absl::Status CheckModelOptions(const Json& m) {
  if (!TypeOf(m).empty() && TypeOf(m) != "BPE") {
    return Invalid("model.type", absl::StrCat("'", TypeOf(m), "' is not supported (BPE only)"));
  }
  if (const Json& dropout = Field(m, "dropout"); !dropout.is_null() && dropout != 0) {
    return Invalid("model.dropout", "BPE dropout is not supported");
  }
  if (!EmptyOrNull(m, "continuing_subword_prefix") || !EmptyOrNull(m, "end_of_word_suffix")) {
    return Invalid("model", "continuing_subword_prefix / end_of_word_suffix are not supported");
  }
  if (FlagOr(m, "byte_fallback", false)) return Invalid("model.byte_fallback", "not supported");
  return absl::OkStatus();
}

absl::Status ParseVocab(const Json& vocab, BpeModelSpec* model) {
  if (!vocab.is_object()) return Invalid("model.vocab", "must be an object of token -> id");
  model->vocab.reserve(vocab.size());
  for (const auto& [token, id] : vocab.items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX) {
      return Invalid(absl::StrCat("model.vocab['", token, "']"),
                     "id must be a non-negative integer");
    }
    model->vocab.emplace(token, id.get<int32_t>());
  }
  return absl::OkStatus();
}

// Each merge is "left right" (older files) or ["left", "right"].
absl::Status ParseMerges(const Json& merges, BpeModelSpec* model) {
  if (!merges.is_array()) return Invalid("model.merges", "must be an array");
  model->merges.reserve(merges.size());
  for (size_t i = 0; i < merges.size(); ++i) {
    const Json& m = merges[i];
    if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      model->merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
      continue;
    }
    std::vector<std::string> parts;
    if (m.is_string()) parts = absl::StrSplit(m.get<std::string>(), ' ');
    if (parts.size() != 2) {
      return Invalid(absl::StrCat("model.merges[", i, "]"),
                     "expected \"left right\" or [left, right]");
    }
    model->merges.emplace_back(std::move(parts[0]), std::move(parts[1]));
  }
  return absl::OkStatus();
}

absl::Status ParseModel(const Json& m, BpeModelSpec* model) {
  if (!m.is_object()) return Invalid("model", "missing or not an object");
  if (auto s = CheckModelOptions(m); !s.ok()) return s;
  if (auto s = ParseVocab(Field(m, "vocab"), model); !s.ok()) return s;
  if (auto s = ParseMerges(Field(m, "merges"), model); !s.ok()) return s;
  model->ignore_merges = FlagOr(m, "ignore_merges", false);
  return absl::OkStatus();
}

absl::Status ParseAddedTokens(const Json& list, std::vector<AddedToken>* out) {
  if (list.is_null()) return absl::OkStatus();
  if (!list.is_array()) return Invalid("added_tokens", "must be an array");
  for (size_t i = 0; i < list.size(); ++i) {
    const Json& t = list[i];
    const std::string path = absl::StrCat("added_tokens[", i, "]");
    if (!t.is_object() || !t.contains("id") || !t["id"].is_number_integer() ||
        t["id"].get<int64_t>() < 0 || t["id"].get<int64_t>() > INT32_MAX ||
        !t.contains("content") || !t["content"].is_string()) {
      return Invalid(path, "needs an integer id >= 0 and a string content");
    }
    AddedToken token;
    token.id = t["id"].get<int32_t>();
    token.content = t["content"].get<std::string>();
    if (token.content.empty()) return Invalid(path, "content is empty");
    token.special = FlagOr(t, "special", false);
    token.single_word = FlagOr(t, "single_word", false);
    token.lstrip = FlagOr(t, "lstrip", false);
    token.rstrip = FlagOr(t, "rstrip", false);
    token.normalized = FlagOr(t, "normalized", !token.special);
    out->push_back(std::move(token));
  }
  return absl::OkStatus();
}

// The tokenizer keeps a table indexed by id, so ids must be nearly dense: the highest may lie at
// most kMaxIdGap past the number of tokens (real files leave a few reserved ids unused; a stray
// id in the billions would otherwise allocate gigabytes: found by tokenizer_fuzz).
constexpr int64_t kMaxIdGap = int64_t{1} << 20;

absl::Status CheckIdsDense(const TokenizerSpec& spec) {
  int64_t highest = -1;
  std::string where;
  for (const auto& [token, id] : spec.model.vocab) {
    if (id <= highest) continue;
    highest = id;
    where = absl::StrCat("model.vocab['", token, "']");
  }
  for (size_t i = 0; i < spec.added_tokens.size(); ++i) {
    if (spec.added_tokens[i].id <= highest) continue;
    highest = spec.added_tokens[i].id;
    where = absl::StrCat("added_tokens[", i, "].id");
  }
  const int64_t tokens = static_cast<int64_t>(spec.model.vocab.size() + spec.added_tokens.size());
  if (highest < tokens + kMaxIdGap) return absl::OkStatus();
  return Invalid(where, absl::StrCat("id ", highest, " is far past the ", tokens,
                                     " tokens defined (ids must be nearly dense: at most ",
                                     kMaxIdGap, " unused)"));
}

absl::Status CheckDecoder(const Json& d) {
  if (TypeOf(d) == "ByteLevel") return absl::OkStatus();
  return Invalid("decoder", absl::StrCat("unsupported type '", TypeOf(d), "' (ByteLevel only)"));
}

}  // namespace

absl::StatusOr<TokenizerSpec> ParseTokenizerJson(absl::string_view json_text) {
  Json root;
  try {
    root = Json::parse(json_text.begin(), json_text.end());
  } catch (const Json::exception& e) {
    // parse_error for bad syntax; out_of_range for a number no double holds (found by
    // tokenizer_fuzz, tests/fuzz/regressions/tokenizer_fuzz).
    return absl::InvalidArgumentError(absl::StrCat("not valid JSON: ", e.what()));
  }
  if (!root.is_object()) return absl::InvalidArgumentError("not a JSON object");
  TokenizerSpec spec;
  auto nfc = ParseNormalizer(Field(root, "normalizer"), "normalizer");
  if (!nfc.ok()) return nfc.status();
  spec.nfc = *nfc;
  auto pattern = ParsePreTokenizer(Field(root, "pre_tokenizer"));
  if (!pattern.ok()) return pattern.status();
  spec.split_pattern = std::move(*pattern);
  if (auto s = ParseModel(Field(root, "model"), &spec.model); !s.ok()) return s;
  if (auto s = ParseAddedTokens(Field(root, "added_tokens"), &spec.added_tokens); !s.ok()) return s;
  if (auto s = CheckDecoder(Field(root, "decoder")); !s.ok()) return s;
  if (auto s = CheckIdsDense(spec); !s.ok()) return s;
  return spec;
}

}  // namespace trainctl::tokenizer::internal
