// Job specs read from files (common/job_spec.h LoadJobSpecFile, EmbedDeepSpeedConfig): the format
// chosen by the extension, the DeepSpeed file read relative to the spec, and every error naming the
// file. Parsing, defaults and validation: job_spec_test.cc.
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/job_spec.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "tests/common/job_spec_fixtures.h"

namespace trainctl {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::StartsWith;
using namespace spec_testing;  // NOLINT(build/namespaces): the suites' shared fixtures

// --- Loading files ---------------------------------------------------------------------------

TEST(LoadJobSpecFileTest, MissingFileIsNotFound) {
  ScratchDir dir;
  const std::string path = dir.path() + "/nope.yaml";
  absl::StatusOr<JobSpec> spec = LoadJobSpecFile(path);
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(spec.status().message()), HasSubstr(path));
}

TEST(LoadJobSpecFileTest, DeepSpeedPathIsReadRelativeToTheSpecFile) {
  ScratchDir dir;
  const std::string ds_text = ReadTextFile(kSeedDeepSpeed);
  ASSERT_FALSE(ds_text.empty());
  dir.Write("configs/ds.json", ds_text);
  const std::string path =
      dir.Write("jobs/seed.yaml", std::string(kMinimalSpec) + "deepspeed: ../configs/ds.json\n");

  absl::StatusOr<JobSpec> spec = LoadJobSpecFile(path);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->deepspeed(), "../configs/ds.json");  // kept for provenance
  EXPECT_EQ(spec->deepspeed_config_json(), ds_text);   // embedded byte for byte
}

TEST(LoadJobSpecFileTest, AbsoluteDeepSpeedPathIsReadAsIs) {
  ScratchDir dir;
  const std::string path =
      dir.Write("seed.yaml", absl::StrCat(kMinimalSpec, "deepspeed: ", kSeedDeepSpeed, "\n"));
  absl::StatusOr<JobSpec> spec = LoadJobSpecFile(path);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->deepspeed_config_json(), ReadTextFile(kSeedDeepSpeed));
}

TEST(LoadJobSpecFileTest, JsonExtensionSelectsTheJsonParser) {
  ScratchDir dir;
  const std::string path = dir.Write("seed.JSON", kSeedJson);
  absl::StatusOr<JobSpec> spec = LoadJobSpecFile(path);
  ASSERT_TRUE(spec.ok()) << spec.status();
  absl::StatusOr<JobSpec> expected = ParseYaml(kSeedYaml);
  ASSERT_TRUE(expected.ok()) << expected.status();
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(*spec, *expected));

  // A JSON syntax error is reported as JSON, naming the file.
  const std::string bad = dir.Write("bad.json", "{\"kind\": sft}");
  absl::StatusOr<JobSpec> bad_spec = LoadJobSpecFile(bad);
  ASSERT_EQ(bad_spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad_spec.status().message()), StartsWith(bad + ":1:"));
  EXPECT_THAT(std::string(bad_spec.status().message()), HasSubstr("invalid JSON"));
}

TEST(LoadJobSpecFileTest, YamlSyntaxErrorNamesTheFile) {
  ScratchDir dir;
  const std::string path = dir.Write("bad.yaml", "kind: sft\nenv: {A: 1\n");
  absl::StatusOr<JobSpec> spec = LoadJobSpecFile(path);
  ASSERT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(spec.status().message()), StartsWith(path + ":"));
}

TEST(LoadJobSpecFileTest, MissingDeepSpeedFileNamesTheFile) {
  ScratchDir dir;
  const std::string path =
      dir.Write("seed.yaml", std::string(kMinimalSpec) + "deepspeed: ds.json\n");
  absl::StatusOr<JobSpec> spec = LoadJobSpecFile(path);
  ASSERT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(
      std::string(spec.status().message()),
      AllOf(StartsWith("spec.deepspeed: cannot read "), HasSubstr(dir.path() + "/ds.json")));
}

TEST(LoadJobSpecFileTest, DeepSpeedSyntaxErrorNamesTheFile) {
  ScratchDir dir;
  const std::string ds = dir.Write("ds.json", "{\n\"zero_optimization\": {\"stage\": 3,}\n}\n");
  const std::string path =
      dir.Write("seed.yaml", std::string(kMinimalSpec) + "deepspeed: ds.json\n");
  absl::StatusOr<JobSpec> spec = LoadJobSpecFile(path);
  ASSERT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(spec.status().message()), StartsWith("spec.deepspeed: "));
  EXPECT_THAT(std::string(spec.status().message()), HasSubstr(ds));
}

TEST(EmbedDeepSpeedConfigTest, DoesNothingWithoutAPathOrWhenAlreadyEmbedded) {
  JobSpec none;
  ASSERT_TRUE(EmbedDeepSpeedConfig("/nonexistent", &none).ok());
  EXPECT_EQ(none.deepspeed_config_json(), "");

  JobSpec embedded;
  embedded.set_deepspeed("missing.json");
  embedded.set_deepspeed_config_json("{}");
  ASSERT_TRUE(EmbedDeepSpeedConfig("/nonexistent", &embedded).ok());
  EXPECT_EQ(embedded.deepspeed_config_json(), "{}");
}

TEST(EmbedDeepSpeedConfigTest, ReadsRelativeToBaseDir) {
  JobSpec spec;
  spec.set_deepspeed("./configs/ds_zero3_bf16.json");
  ASSERT_TRUE(EmbedDeepSpeedConfig(kSourceDir, &spec).ok());
  EXPECT_EQ(spec.deepspeed_config_json(), ReadTextFile(kSeedDeepSpeed));
}

}  // namespace
}  // namespace trainctl
