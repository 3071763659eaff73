// `trainctl logs` on a terminal: a rank's control characters are written out, not obeyed.
#include "cli/terminal_text.h"

#include <string>

#include "gtest/gtest.h"

namespace trainctl::cli {
namespace {

TEST(EscapeForTerminalTest, ControlCharactersAreWrittenOut) {
  EXPECT_EQ(EscapeForTerminal("\x1b[2J\x1b]0;pwned\x07"), "\\x1b[2J\\x1b]0;pwned\\x07");
  EXPECT_EQ(EscapeForTerminal(std::string("a\0b", 3)), "a\\x00b");
  EXPECT_EQ(EscapeForTerminal("50%\r100%\b\x7f"), "50%\\x0d100%\\x08\\x7f");
  // C1 controls as UTF-8 (U+009B is CSI on some terminals).
  EXPECT_EQ(EscapeForTerminal("\xc2\x9b"
                              "31m"),
            "\\u009b31m");
}

TEST(EscapeForTerminalTest, PrintableTextIsUnchanged) {
  const std::string text = "step 3\tloss 0.25 \xe2\x96\x88 caf\xc3\xa9 \xc2\xa0 C:\\path";
  EXPECT_EQ(EscapeForTerminal(text), text);
  EXPECT_EQ(EscapeForTerminal(""), "");
}

}  // namespace
}  // namespace trainctl::cli
