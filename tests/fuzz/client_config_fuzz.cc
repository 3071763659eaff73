// trainctl's ~/.config/trainctl/config (common/client_config.h). A file that parses gives only the
// known keys, each value trimmed and free of comments and line breaks.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <set>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/string_view.h"
#include "common/client_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  auto config = trainctl::ParseClientConfig(text, "fuzz/config", "/home/fuzz");
  if (!config.ok()) return 0;
  static const std::set<std::string> kKeys = {"coordinator", "tls_ca", "tls_cert", "tls_key",
                                              "token_file"};
  for (const auto& [key, value] : *config) {
    if (kKeys.count(key) == 0) std::abort();
    if (value.find_first_of("#\n") != std::string::npos) std::abort();
    if (absl::StripAsciiWhitespace(value).size() != value.size()) std::abort();
  }
  return 0;
}
