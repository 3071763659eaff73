#include "common/utf8.h"

#include <string>

#include "gtest/gtest.h"

namespace trainctl {
namespace {

const std::string kReplacement = "\xEF\xBF\xBD";

TEST(Utf8Test, WellFormedTextIsKept) {
  for (const std::string s : {"", "plain", "caf\xC3\xA9", "\xE4\xB8\xAD\xE6\x96\x87",
                              "\xF0\x9F\x98\x80", "\xF4\x8F\xBF\xBF"}) {
    EXPECT_TRUE(IsValidUtf8(s)) << s;
    EXPECT_EQ(ToValidUtf8(s), s);
  }
}

TEST(Utf8Test, EachMaximalIllFormedSubpartBecomesOneReplacementCharacter) {
  EXPECT_EQ(ToValidUtf8("caf\xE9"), "caf" + kReplacement);  // Latin-1
  EXPECT_EQ(ToValidUtf8("caf\xE9 au lait"), "caf" + kReplacement + " au lait");
  EXPECT_EQ(ToValidUtf8("\xC0\xAF"), kReplacement + kReplacement);  // overlong '/'
  EXPECT_EQ(ToValidUtf8("\xED\xA0\x80"), kReplacement + kReplacement + kReplacement);  // surrogate
  // Above U+10FFFF: F4 90 is ill-formed at its second byte, so each byte is a subpart.
  EXPECT_EQ(ToValidUtf8("\xF4\x90\x80\x80"),
            kReplacement + kReplacement + kReplacement + kReplacement);
  EXPECT_EQ(ToValidUtf8("\xE4\xB8"), kReplacement);  // a truncated 3-byte character
  EXPECT_EQ(ToValidUtf8("\xE4\xB8x"), kReplacement + "x");
  EXPECT_FALSE(IsValidUtf8("\xE4\xB8"));
  EXPECT_TRUE(IsValidUtf8(ToValidUtf8("\xFF\xFE\x80\xC3")));
}

TEST(Utf8Test, PrefixLengthCutsBetweenCharacters) {
  const std::string e = "\xC3\xA9";  // 2 bytes
  EXPECT_EQ(Utf8PrefixLength("abc", 10), 3u);
  EXPECT_EQ(Utf8PrefixLength("a" + e + e, 2), 1u);  // not inside the first é
  EXPECT_EQ(Utf8PrefixLength("a" + e + e, 3), 3u);
  const std::string emoji = "\xF0\x9F\x98\x80";
  for (size_t max = 5; max < 8; ++max) {
    EXPECT_EQ(Utf8PrefixLength("x" + emoji + emoji, max), 5u) << max;
  }
  // Ill-formed bytes: cut where asked.
  EXPECT_EQ(Utf8PrefixLength("\x80\x80\x80\x80\x80\x80", 4), 4u);
  // A cut in a loop always makes progress and keeps well-formed pieces well-formed.
  std::string text = "a";
  for (int i = 0; i < 100; ++i) text += emoji + e + "z";
  std::string joined;
  for (absl::string_view rest = text; !rest.empty();) {
    const size_t n = Utf8PrefixLength(rest, 7);
    ASSERT_GT(n, 0u);
    ASSERT_LE(n, 7u);
    EXPECT_TRUE(IsValidUtf8(rest.substr(0, n)));
    joined += std::string(rest.substr(0, n));
    rest.remove_prefix(n);
  }
  EXPECT_EQ(joined, text);
}

// The tokenizer decodes byte-level BPE output through this repair, as Rust's from_utf8_lossy.
TEST(Utf8Test, LossyRepairReplacesMaximalSubparts) {
  EXPECT_EQ(ToValidUtf8("a\xE0\x80z"), "a\uFFFD\uFFFDz");  // E0 80 is never valid: two parts
  EXPECT_EQ(ToValidUtf8("\xF4\x90\x80\x80"), "\uFFFD\uFFFD\uFFFD\uFFFD");  // above U+10FFFF
  EXPECT_EQ(ToValidUtf8("\xED\xA0\x80"), "\uFFFD\uFFFD\uFFFD");            // a surrogate
  EXPECT_EQ(ToValidUtf8("\xE2\x82"), "\uFFFD");                            // truncated
  EXPECT_EQ(FindInvalidUtf8("ok \xC0\xAF"), 3u);
  EXPECT_EQ(FindInvalidUtf8("한국어 😀"), kValidUtf8);
}

}  // namespace
}  // namespace trainctl
