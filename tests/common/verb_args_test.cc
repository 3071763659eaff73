#include "common/verb_args.h"

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainctl {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Pair;
using ::testing::UnorderedElementsAre;

// Options shaped like trainctl's verbs: valued options with and without aliases, and switches.
std::vector<OptionSpec> Specs() {
  return {{"coordinator", "", true},
          {"output", "-o", true},
          {"file", "-f", true},
          {"follow", "-F", false},
          {"all", "", false}};
}

absl::StatusOr<ParsedArgs> Parse(const std::vector<std::string>& args, bool passthrough = false) {
  return ParseArgs(args, Specs(), passthrough);
}

TEST(ParseArgsTest, EmptyArgs) {
  absl::StatusOr<ParsedArgs> parsed = Parse({});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_THAT(parsed->options, IsEmpty());
  EXPECT_THAT(parsed->positional, IsEmpty());
  EXPECT_THAT(parsed->passthrough, IsEmpty());
}

TEST(ParseArgsTest, OptionWithSeparateValue) {
  absl::StatusOr<ParsedArgs> parsed = Parse({"--coordinator", "localhost:50051"});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_THAT(parsed->options, ElementsAre(Pair("coordinator", "localhost:50051")));
  EXPECT_TRUE(parsed->Has("coordinator"));
  EXPECT_EQ(parsed->Get("coordinator"), "localhost:50051");
}

TEST(ParseArgsTest, OptionWithEqualsValue) {
  absl::StatusOr<ParsedArgs> parsed = Parse({"--coordinator=10.0.0.1:50051"});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->Get("coordinator"), "10.0.0.1:50051");
}

TEST(ParseArgsTest, EqualsValueMayContainEqualsAndBeEmpty) {
  absl::StatusOr<ParsedArgs> parsed = Parse({"--file=a=b.yaml", "--output="});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->Get("file"), "a=b.yaml");
  EXPECT_TRUE(parsed->Has("output"));
  EXPECT_EQ(parsed->Get("output", "table"), "");
}

TEST(ParseArgsTest, SeparateValueMayLookLikeAFlag) {
  // A valued option takes the next argument whatever it looks like.
  absl::StatusOr<ParsedArgs> parsed = Parse({"--file", "-"});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->Get("file"), "-");
}

TEST(ParseArgsTest, ShortAliasIsStoredUnderTheLongName) {
  absl::StatusOr<ParsedArgs> parsed = Parse({"-o", "json"});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_THAT(parsed->options, ElementsAre(Pair("output", "json")));
  EXPECT_EQ(parsed->Get("output"), "json");
  EXPECT_FALSE(parsed->Has("o"));
}

TEST(ParseArgsTest, ShortAliasWithEquals) {
  absl::StatusOr<ParsedArgs> parsed = Parse({"-o=yaml"});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->Get("output"), "yaml");
}

TEST(ParseArgsTest, SwitchesTakeNoValue) {
  absl::StatusOr<ParsedArgs> parsed = Parse({"-F", "job-1", "--all"});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_THAT(parsed->options, UnorderedElementsAre(Pair("follow", "true"), Pair("all", "true")));
  EXPECT_THAT(parsed->positional, ElementsAre("job-1"));  // not consumed by the switch
}

TEST(ParseArgsTest, ShortAliasForAValuedOption) {
  absl::StatusOr<ParsedArgs> parsed = Parse({"-f", "spec.yaml", "job-1"});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->Get("file"), "spec.yaml");
  EXPECT_THAT(parsed->positional, ElementsAre("job-1"));
}

// `--follow=false` turns the switch off (it used to be kept as "false", which Has() took for on).
TEST(ParseArgsTest, SwitchWithExplicitValue) {
  absl::StatusOr<ParsedArgs> parsed = Parse({"--follow=false"});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_FALSE(parsed->Has("follow"));
  parsed = Parse({"--follow=true"});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->Get("follow"), "true");
  parsed = Parse({"-F", "--follow=false"});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_FALSE(parsed->Has("follow"));
  parsed = Parse({"--follow=yes"});
  ASSERT_FALSE(parsed.ok());
  EXPECT_THAT(std::string(parsed.status().message()),
              HasSubstr("--follow: a switch takes no value"));
}

TEST(ParseArgsTest, EveryValueOfARepeatedOptionIsKept) {
  absl::StatusOr<ParsedArgs> parsed = Parse({"-o", "json", "--output=table", "-o", "wide"});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->Get("output"), "wide");
  EXPECT_THAT(parsed->GetAll("output"), ElementsAre("json", "table", "wide"));
  EXPECT_THAT(parsed->GetAll("coordinator"), ElementsAre());
}

TEST(ParseArgsTest, PositionalArgumentsAnywhereInOrder) {
  absl::StatusOr<ParsedArgs> parsed =
      Parse({"job-1", "--output", "json", "job-2", "-F", "job-3", "-"});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_THAT(parsed->positional, ElementsAre("job-1", "job-2", "job-3", "-"));
  EXPECT_EQ(parsed->Get("output"), "json");
  EXPECT_EQ(parsed->Get("follow"), "true");
}

TEST(ParseArgsTest, LaterValueWins) {
  absl::StatusOr<ParsedArgs> parsed = Parse({"-o", "json", "--output=table"});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->Get("output"), "table");
}

TEST(ParseArgsTest, GetFallsBackWhenAbsent) {
  absl::StatusOr<ParsedArgs> parsed = Parse({});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_FALSE(parsed->Has("output"));
  EXPECT_EQ(parsed->Get("output"), "");
  EXPECT_EQ(parsed->Get("output", "table"), "table");
}

TEST(ParseArgsTest, PassthroughKeepsUnknownFlagsAndValuesInOrder) {
  // `trainctl submit` with the seed's launch line.
  absl::StatusOr<ParsedArgs> parsed =
      Parse({"--coordinator", "c:1", "--num_gpus=8", "src/train_multimodal.py",
             "--model_name_or_path", "Qwen/Qwen2-VL-7B-Instruct", "-o", "json", "--bf16", "True",
             "--gradient_checkpointing", "--learning_rate", "2e-5", "--max_steps", "-1"},
            /*passthrough=*/true);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_THAT(parsed->options,
              UnorderedElementsAre(Pair("coordinator", "c:1"), Pair("output", "json")));
  EXPECT_THAT(parsed->positional, ElementsAre("src/train_multimodal.py"));
  EXPECT_THAT(parsed->passthrough,
              ElementsAre("--num_gpus=8", "--model_name_or_path", "Qwen/Qwen2-VL-7B-Instruct",
                          "--bf16", "True", "--gradient_checkpointing", "--learning_rate", "2e-5",
                          "--max_steps", "-1"));
}

TEST(ParseArgsTest, UnknownLongOptionIsAnErrorWithoutPassthrough) {
  absl::StatusOr<ParsedArgs> parsed = Parse({"--bf16", "True"});
  ASSERT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(parsed.status().message(), "--bf16: unknown option");

  absl::StatusOr<ParsedArgs> with_value = Parse({"--colour=red"});
  ASSERT_EQ(with_value.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(with_value.status().message(), "--colour: unknown option");
}

TEST(ParseArgsTest, UnknownShortOptionIsAlwaysAnError) {
  for (bool passthrough : {false, true}) {
    absl::StatusOr<ParsedArgs> parsed = Parse({"-x"}, passthrough);
    ASSERT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << passthrough;
    EXPECT_EQ(parsed.status().message(), "-x: unknown option");
  }
}

TEST(ParseArgsTest, MissingValueNamesTheOption) {
  absl::StatusOr<ParsedArgs> parsed = Parse({"job-1", "--coordinator"});
  ASSERT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(parsed.status().message(), "--coordinator: needs a value");

  absl::StatusOr<ParsedArgs> alias = Parse({"-o"});
  ASSERT_EQ(alias.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(alias.status().message(), "-o: needs a value");
}

std::vector<OptionSpec> Globals() { return {{"coordinator", "", true}, {"output", "-o", true}}; }

TEST(ParseLeadingOptionsTest, GlobalOptionsBeforeTheVerb) {
  const std::vector<std::string> args = {"--coordinator", "h:1", "-o=json", "ls", "--state", "x"};
  absl::StatusOr<LeadingArgs> leading = ParseLeadingOptions(args, Globals());
  ASSERT_TRUE(leading.ok()) << leading.status();
  EXPECT_THAT(leading->options,
              UnorderedElementsAre(Pair("coordinator", "h:1"), Pair("output", "json")));
  EXPECT_EQ(leading->verb_index, 3u);

  absl::StatusOr<LeadingArgs> none = ParseLeadingOptions({"ls", "--coordinator", "h:1"}, Globals());
  ASSERT_TRUE(none.ok());
  EXPECT_THAT(none->options, IsEmpty());
  EXPECT_EQ(none->verb_index, 0u);

  absl::StatusOr<LeadingArgs> only = ParseLeadingOptions({"--coordinator=h:1"}, Globals());
  ASSERT_TRUE(only.ok());
  EXPECT_EQ(only->verb_index, 1u);  // no verb
}

TEST(ParseLeadingOptionsTest, OtherOptionsAndMissingValuesAreErrors) {
  absl::StatusOr<LeadingArgs> other = ParseLeadingOptions({"--state", "running", "ls"}, Globals());
  ASSERT_EQ(other.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(other.status().message(),
            "--state: unknown option before the command (only --coordinator and -o may come "
            "before it)");
  absl::StatusOr<LeadingArgs> missing = ParseLeadingOptions({"--coordinator"}, Globals());
  ASSERT_EQ(missing.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(missing.status().message(), "--coordinator: needs a value");
}

TEST(MergeLeadingOptionsTest, BeforeOrAfterTheVerbIsTheSameAndAfterWins) {
  const std::vector<OptionSpec> ls = {
      {"coordinator", "", true}, {"output", "-o", true}, {"state", "", true}};
  // `trainctl --coordinator h:1 ls` == `trainctl ls --coordinator h:1`
  const std::vector<std::string> before = {"--coordinator", "h:1", "ls", "--state", "running"};
  absl::StatusOr<LeadingArgs> leading = ParseLeadingOptions(before, Globals());
  ASSERT_TRUE(leading.ok());
  absl::StatusOr<ParsedArgs> parsed =
      ParseArgs({before.begin() + leading->verb_index + 1, before.end()}, ls, false);
  ASSERT_TRUE(parsed.ok());
  ASSERT_TRUE(MergeLeadingOptions(*leading, ls, &*parsed).ok());
  absl::StatusOr<ParsedArgs> after =
      ParseArgs({"--state", "running", "--coordinator", "h:1"}, ls, false);
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(parsed->options, after->options);

  // Both: the one after the verb is the more specific.
  absl::StatusOr<ParsedArgs> both = ParseArgs({"--coordinator", "h:2"}, ls, false);
  ASSERT_TRUE(both.ok());
  ASSERT_TRUE(MergeLeadingOptions(*leading, ls, &*both).ok());
  EXPECT_EQ(both->Get("coordinator"), "h:2");

  // A verb without the option refuses it wherever it comes.
  ParsedArgs tokenize;
  absl::Status refused = MergeLeadingOptions(*leading, {{"tokenizer", "", true}}, &tokenize);
  ASSERT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(refused.message(), "--coordinator: not an option of this command");
}

}  // namespace
}  // namespace trainctl
