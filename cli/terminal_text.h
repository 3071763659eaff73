// Text from outside the process (a rank's log lines) made safe to print on a terminal.
#ifndef TRAINCTL_CLI_TERMINAL_TEXT_H_
#define TRAINCTL_CLI_TERMINAL_TEXT_H_

#include <string>

#include "absl/strings/string_view.h"

namespace trainctl::cli {

// `text` with every control character a terminal would act on written out instead: C0 controls
// (NUL, ESC, CR, BEL, backspace, ...; tab is kept) and DEL as `\xNN`, and the C1 controls
// U+0080-U+009F (CSI among them) as `\u00NN`. Printable text, UTF-8 included, is unchanged, and a
// backslash stays a backslash. For a TTY only: piped output keeps a rank's bytes as they were.
std::string EscapeForTerminal(absl::string_view text);

}  // namespace trainctl::cli

#endif  // TRAINCTL_CLI_TERMINAL_TEXT_H_
