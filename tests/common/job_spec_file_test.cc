// Job specs read from files (common/job_spec.h LoadJobSpecFile, EmbedDeepSpeedConfig): the format
// chosen by the extension, the DeepSpeed file read relative to the spec, and every error naming the
// file. Parsing, defaults and validation: job_spec_test.cc.
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/job_spec.h"
#include "common/json_proto.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "tests/common/job_spec_fixtures.h"
#include "trainctl/v1/worker.pb.h"

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

// --- The launch file -------------------------------------------------------------------------

// What a worker writes for its ranks (worker/daemon/worker.cc: the LaunchTask as protobuf's JSON)
// reads back (worker/trainer/trainer_main.cc RunFromLaunch) as the same message: full enum names,
// 64-bit integers as strings, explicit zeros of optional fields, an empty section that turns
// something on.
TEST(LaunchFileTest, TheWorkersLaunchFileReadsBackAsTheSameLaunch) {
  absl::StatusOr<JobSpec> spec = ParseJobSpec(kSeedYaml, SpecFormat::kYaml, "seed.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  spec->mutable_training()->set_temperature(0);
  spec->mutable_training()->set_max_steps(12345678901);
  spec->mutable_remedies()->mutable_loss_spike();
  absl::StatusOr<ValidatedJobSpec> validated = ValidateJobSpec(*spec);
  ASSERT_TRUE(validated.ok()) << validated.status();
  trainctl::v1::LaunchTask launch;
  *launch.mutable_spec() = validated->spec;
  launch.set_resolved_deepspeed_config_json(validated->resolved_deepspeed_config_json);
  launch.set_task_id("job-7.2.1");
  launch.set_attempt(2);
  launch.set_world_size(16);
  ASSERT_TRUE(launch.spec().training().has_temperature());
  ASSERT_TRUE(launch.spec().remedies().has_loss_spike());

  const std::string text = MessageToJsonText(launch, /*pretty=*/true);
  EXPECT_THAT(text, HasSubstr("\"JOB_KIND_SFT\""));
  EXPECT_THAT(text, HasSubstr("\"12345678901\""));  // protobuf writes int64 as a string
  absl::StatusOr<nlohmann::json> doc = ParseJsonText(text, "launch.json");
  ASSERT_TRUE(doc.ok()) << doc.status();
  trainctl::v1::LaunchTask read;
  std::vector<std::string> errors;
  DecodeJsonIntoMessage(*doc, "launch", &read, &errors);
  EXPECT_THAT(errors, ::testing::IsEmpty());
  std::string diff;
  google::protobuf::util::MessageDifferencer differencer;
  differencer.ReportDifferencesToString(&diff);
  EXPECT_TRUE(differencer.Compare(launch, read)) << diff;
}

}  // namespace
}  // namespace trainctl
