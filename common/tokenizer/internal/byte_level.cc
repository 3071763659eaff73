#include "common/tokenizer/internal/byte_level.h"

#include "common/tokenizer/internal/utf8.h"

namespace trainctl::tokenizer::internal {
namespace {

bool StandsForItself(int b) {
  return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

struct Alphabet {
  std::array<std::string, 256> symbols;
  std::array<int16_t, 0x100 + 68> byte_of;  // code point -> byte, -1 when not a symbol

  Alphabet() {
    byte_of.fill(-1);
    int next_extra = 0x100;
    for (int b = 0; b < 256; ++b) {
      const char32_t c = StandsForItself(b) ? b : next_extra++;
      AppendUtf8(c, &symbols[b]);
      byte_of[c] = static_cast<int16_t>(b);
    }
  }
};

const Alphabet& TheAlphabet() {
  static const Alphabet* alphabet = new Alphabet();
  return *alphabet;
}

// The byte that code point `c` stands for, or -1.
int ByteOf(char32_t c) {
  const auto& byte_of = TheAlphabet().byte_of;
  return c < byte_of.size() ? byte_of[c] : -1;
}

}  // namespace

const std::array<std::string, 256>& ByteSymbols() { return TheAlphabet().symbols; }

bool AppendSymbolBytes(absl::string_view token, std::string* bytes) {
  const size_t old_size = bytes->size();
  for (size_t i = 0; i < token.size();) {
    int len = 0;
    const int b = ByteOf(DecodeUtf8(token, i, &len));
    if (b < 0) {
      bytes->resize(old_size);
      return false;
    }
    bytes->push_back(static_cast<char>(b));
    i += len;
  }
  return true;
}

int SymbolCount(absl::string_view token) {
  std::string bytes;
  return AppendSymbolBytes(token, &bytes) ? static_cast<int>(bytes.size()) : -1;
}

}  // namespace trainctl::tokenizer::internal
