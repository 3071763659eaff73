// The coordinator's --tokens_file (common/access_tokens.h), read at start and on every SIGHUP
// (systemctl reload), so a bad edit meets it on a live coordinator. A table that parses holds at
// most one token per line and answers any lookup without throwing.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "absl/strings/string_view.h"
#include "common/access_tokens.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  auto table = trainctl::TokenTable::Parse(text, "fuzz/tokens");
  if (!table.ok()) return 0;
  const size_t lines = 1 + static_cast<size_t>(std::count(text.begin(), text.end(), '\n'));
  if (table->size() > lines) std::abort();
  for (size_t n = 0; n <= std::min<size_t>(text.size(), 256); n += 17) {
    (void)table->Authenticate(text.substr(0, n));
  }
  return 0;
}
