#include "common/tokenizer/bpe_tokenizer.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/tokenizer/internal/added_tokens.h"
#include "common/tokenizer/internal/bpe_model.h"
#include "common/tokenizer/internal/byte_level.h"
#include "common/tokenizer/internal/nfc.h"
#include "common/tokenizer/internal/split_regex.h"
#include "common/tokenizer/internal/tokenizer_json.h"
#include "common/tokenizer/internal/utf8.h"
#include "common/utf8.h"

namespace trainctl::tokenizer {
namespace {

using internal::AddedToken;
using internal::AddedTokenMatcher;
using internal::TextPiece;

absl::Status WithSource(absl::string_view source, const absl::Status& status) {
  return absl::Status(status.code(), absl::StrCat(source, ": ", status.message()));
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return absl::NotFoundError(absl::StrCat("cannot read ", path, ": ", std::strerror(errno)));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat("error reading ", path));
  return std::move(text).str();
}

int32_t HighestId(const internal::TokenizerSpec& spec) {
  int32_t highest = -1;
  for (const auto& [token, id] : spec.model.vocab) highest = std::max(highest, id);
  for (const AddedToken& t : spec.added_tokens) highest = std::max(highest, t.id);
  return highest;
}

}  // namespace

BpeTokenizer::BpeTokenizer() = default;
BpeTokenizer::~BpeTokenizer() = default;

absl::StatusOr<std::unique_ptr<BpeTokenizer>> BpeTokenizer::Load(const std::string& path) {
  std::error_code ec;
  const std::string file = std::filesystem::is_directory(path, ec)
                               ? (std::filesystem::path(path) / "tokenizer.json").string()
                               : path;
  auto text = ReadFile(file);
  if (!text.ok()) return text.status();
  return FromJson(*text, file);
}

absl::StatusOr<std::unique_ptr<BpeTokenizer>> BpeTokenizer::FromJson(absl::string_view json,
                                                                     absl::string_view source) {
  auto spec = internal::ParseTokenizerJson(json);
  if (!spec.ok()) return WithSource(source, spec.status());
  std::unique_ptr<BpeTokenizer> tokenizer(new BpeTokenizer());
  if (auto status = tokenizer->Init(std::move(*spec)); !status.ok()) {
    return WithSource(source, status);
  }
  return tokenizer;
}

absl::Status BpeTokenizer::Init(internal::TokenizerSpec spec) {
  nfc_ = spec.nfc;
  if (nfc_) {
    if (auto status = internal::CheckNfcAvailable(); !status.ok()) return status;
  }
  tokens_.resize(HighestId(spec) + 1);
  for (const auto& [token, id] : spec.model.vocab) {
    const int count = internal::SymbolCount(token);
    tokens_[id] = {token, count < 0 ? static_cast<int32_t>(token.size()) : count, true};
  }
  InitAddedTokens(std::move(spec.added_tokens));
  for (const TokenInfo& t : tokens_) {
    const int64_t bytes = t.added ? static_cast<int64_t>(t.text.size()) : t.byte_length;
    max_token_bytes_ = std::max(max_token_bytes_, bytes);
  }
  auto split = internal::SplitRegex::Compile(spec.split_pattern);
  if (!split.ok()) return split.status();
  split_ = std::move(*split);
  auto model = internal::BpeModel::Create(std::move(spec.model));
  if (!model.ok()) return model.status();
  model_ = std::move(*model);
  return absl::OkStatus();
}

void BpeTokenizer::InitAddedTokens(std::vector<AddedToken> tokens) {
  std::vector<AddedToken> raw, normalized;
  for (AddedToken& t : tokens) {
    tokens_[t.id] = {t.content, tokens_[t.id].byte_length, true, true, t.special};
    added_ids_[t.content] = t.id;
    if (t.normalized) {  // HF matches these in a second pass, over the normalized text
      if (auto nfc = nfc_ ? internal::NfcIfChanged(t.content) : std::nullopt) {
        t.content = std::move(*nfc);
      }
      normalized.push_back(std::move(t));
    } else {
      raw.push_back(std::move(t));
    }
  }
  raw_added_ = std::make_unique<AddedTokenMatcher>(std::move(raw));
  normalized_added_ = std::make_unique<AddedTokenMatcher>(std::move(normalized));
}

absl::StatusOr<std::vector<int32_t>> BpeTokenizer::Encode(absl::string_view text) const {
  auto encoding = EncodeWithSpans(text);
  if (!encoding.ok()) return encoding.status();
  return std::move(encoding->ids);
}

absl::StatusOr<Encoding> BpeTokenizer::EncodeWithSpans(absl::string_view text) const {
  if (const size_t bad = FindInvalidUtf8(text); bad != kValidUtf8) {
    return absl::InvalidArgumentError(absl::StrCat("text is not valid UTF-8 (byte ", bad, ")"));
  }
  Encoding out;
  std::vector<TextPiece> pieces;
  raw_added_->Split(text, &pieces);
  for (const TextPiece& piece : pieces) {
    if (piece.token_id != TextPiece::kPlainText) {
      out.ids.push_back(piece.token_id);
      out.spans.emplace_back(piece.begin, piece.end);
      continue;
    }
    const absl::string_view run = text.substr(piece.begin, piece.end - piece.begin);
    if (auto status = EncodeRun(run, piece.begin, &out); !status.ok()) return status;
  }
  return out;
}

absl::Status BpeTokenizer::EncodeRun(absl::string_view run, size_t offset, Encoding* out) const {
  const std::optional<std::string> nfc = nfc_ ? internal::NfcIfChanged(run) : std::nullopt;
  Origin origin{offset, std::nullopt};
  if (nfc) origin.coarse = std::make_pair(offset, offset + run.size());
  const absl::string_view text = nfc ? absl::string_view(*nfc) : run;
  if (normalized_added_->empty()) return EncodePlain(text, origin, out);
  std::vector<TextPiece> pieces;
  normalized_added_->Split(text, &pieces);
  for (const TextPiece& piece : pieces) {
    const Origin piece_origin{origin.offset + piece.begin, origin.coarse};
    if (piece.token_id != TextPiece::kPlainText) {
      out->ids.push_back(piece.token_id);
      out->spans.push_back(
          origin.coarse.value_or(std::make_pair(piece_origin.offset, origin.offset + piece.end)));
      continue;
    }
    const absl::string_view plain = text.substr(piece.begin, piece.end - piece.begin);
    if (auto status = EncodePlain(plain, piece_origin, out); !status.ok()) return status;
  }
  return absl::OkStatus();
}

absl::Status BpeTokenizer::EncodePlain(absl::string_view text, const Origin& origin,
                                       Encoding* out) const {
  std::vector<std::pair<size_t, size_t>> words;
  if (auto status = split_->Split(text, &words); !status.ok()) return status;
  for (const auto& [begin, end] : words) {
    const size_t first_new = out->ids.size();
    model_->Encode(text.substr(begin, end - begin), &out->ids);
    size_t pos = origin.offset + begin;
    for (size_t i = first_new; i < out->ids.size(); ++i) {
      const size_t length = tokens_[out->ids[i]].byte_length;
      out->spans.push_back(origin.coarse.value_or(std::make_pair(pos, pos + length)));
      pos += length;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> BpeTokenizer::Decode(absl::Span<const int32_t> ids,
                                                 bool skip_special_tokens,
                                                 bool drop_unknown_ids) const {
  std::string text;
  std::string bytes;  // of the current run of BPE tokens
  for (const int32_t id : ids) {
    if (id < 0 || id >= vocab_size() || !tokens_[id].present) {
      if (drop_unknown_ids) continue;
      return absl::InvalidArgumentError(
          absl::StrCat("token id ", id, " is not in the vocabulary (size ", vocab_size(), ")"));
    }
    const TokenInfo& token = tokens_[id];
    if (!token.added) {
      // A token that is not all byte-level symbols stands for its own UTF-8, as in HF's decoder.
      if (!internal::AppendSymbolBytes(token.text, &bytes)) bytes += token.text;
      continue;
    }
    if (skip_special_tokens && token.special) continue;
    text += ToValidUtf8(bytes);
    bytes.clear();
    text += token.text;
  }
  text += ToValidUtf8(bytes);
  return text;
}

std::optional<int32_t> BpeTokenizer::TokenToId(absl::string_view token) const {
  if (auto it = added_ids_.find(token); it != added_ids_.end()) return it->second;
  return model_->TokenToId(token);
}

std::string BpeTokenizer::Normalize(absl::string_view text) const {
  if (!nfc_ || FindInvalidUtf8(text) != kValidUtf8) return std::string(text);
  std::optional<std::string> nfc = internal::NfcIfChanged(text);
  return nfc ? std::move(*nfc) : std::string(text);
}

}  // namespace trainctl::tokenizer
