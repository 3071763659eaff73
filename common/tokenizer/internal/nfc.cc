#include "common/tokenizer/internal/nfc.h"

#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>
#include <unicode/stringpiece.h>

#include "absl/strings/str_cat.h"

namespace trainctl::tokenizer::internal {
namespace {

const icu::Normalizer2* Nfc(UErrorCode* status) {
  return icu::Normalizer2::getNFCInstance(*status);
}

// Text below U+0300 contains nothing that composes or reorders, so it is NFC as it stands.
bool TriviallyNfc(absl::string_view text) {
  for (const char c : text) {
    if (static_cast<unsigned char>(c) >= 0xCC) return false;  // a lead byte of U+0300 or above
  }
  return true;
}

}  // namespace

absl::Status CheckNfcAvailable() {
  UErrorCode status = U_ZERO_ERROR;
  Nfc(&status);
  if (U_FAILURE(status)) {
    return absl::InternalError(
        absl::StrCat("ICU NFC normalizer unavailable: ", u_errorName(status)));
  }
  return absl::OkStatus();
}

std::optional<std::string> NfcIfChanged(absl::string_view text) {
  if (TriviallyNfc(text)) return std::nullopt;
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* nfc = Nfc(&status);
  const icu::StringPiece piece(text.data(), static_cast<int32_t>(text.size()));
  if (U_FAILURE(status) || nfc->isNormalizedUTF8(piece, status) || U_FAILURE(status)) {
    return std::nullopt;
  }
  std::string out;
  out.reserve(text.size());
  icu::StringByteSink<std::string> sink(&out);
  nfc->normalizeUTF8(0, piece, sink, nullptr, status);
  if (U_FAILURE(status)) return std::nullopt;
  return out;
}

}  // namespace trainctl::tokenizer::internal
