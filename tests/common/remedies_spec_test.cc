// The `remedies:` section of a job spec (common/remedies_spec.h): parsed from YAML and JSON, off
// unless set, its defaults made explicit, and every bad value an error naming its field.
#include "common/remedies_spec.h"

#include <string>

#include "absl/strings/match.h"
#include "common/job_spec.h"
#include "gtest/gtest.h"

namespace trainctl {
namespace {

namespace v1 = trainctl::v1;

constexpr char kBase[] =
    "kind: sft\nmodel_name_or_path: tiny\ndata_path: /data\noutput_dir: /out\nmax_restarts: 3\n";

absl::StatusOr<ValidatedJobSpec> FromYaml(const std::string& extra) {
  auto spec = ParseJobSpec(std::string(kBase) + extra, SpecFormat::kYaml, "job.yaml");
  if (!spec.ok()) return spec.status();
  return ValidateJobSpec(*spec);
}

TEST(RemediesSpecTest, OffUnlessSet) {
  auto v = FromYaml("");
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_FALSE(v->spec.has_remedies());
}

TEST(RemediesSpecTest, AnEmptyLossSpikeTurnsItOnWithTheSeedValues) {
  auto v = FromYaml("remedies: {oom: true, loss_spike: {}}\n");
  ASSERT_TRUE(v.ok()) << v.status();
  const v1::RemediesSpec& r = v->spec.remedies();
  EXPECT_TRUE(r.oom());
  ASSERT_TRUE(r.has_loss_spike());
  EXPECT_DOUBLE_EQ(r.loss_spike().spike_factor(), 3.0);
  EXPECT_EQ(r.loss_spike().window(), 20);
  EXPECT_EQ(r.loss_spike().max_rollbacks(), 2);
  EXPECT_DOUBLE_EQ(r.loss_spike().max_grad_norm(), 0.5);
  EXPECT_DOUBLE_EQ(r.loss_spike().warmup_ratio(), 0.1);
  EXPECT_TRUE(v->warnings.empty());
}

TEST(RemediesSpecTest, OomAloneLeavesLossSpikeOff) {
  auto v = FromYaml("remedies:\n  oom: true\n");
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_TRUE(v->spec.remedies().oom());
  EXPECT_FALSE(v->spec.remedies().has_loss_spike());
}

TEST(RemediesSpecTest, JsonSpecsToo) {
  auto spec = ParseJobSpec(
      R"({"kind": "sft", "model_name_or_path": "tiny", "data_path": "/d", "output_dir": "/o",
          "remedies": {"loss_spike": {"spike_factor": 5, "window": 10, "max_rollbacks": 1}}})",
      SpecFormat::kJson, "job.json");
  ASSERT_TRUE(spec.ok()) << spec.status();
  auto v = ValidateJobSpec(*spec);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_DOUBLE_EQ(v->spec.remedies().loss_spike().spike_factor(), 5);
  EXPECT_EQ(v->spec.remedies().loss_spike().window(), 10);
  EXPECT_EQ(v->spec.remedies().loss_spike().max_rollbacks(), 1);
  EXPECT_FALSE(v->spec.remedies().oom());
  // max_restarts 0: no remedy can ever run, and the user is told.
  ASSERT_EQ(v->warnings.size(), 1u);
  EXPECT_TRUE(absl::StrContains(v->warnings[0], "spec.remedies: max_restarts is 0"));
}

TEST(RemediesSpecTest, BadValuesNameTheirField) {
  struct Case {
    const char* yaml;
    const char* error;
  };
  const Case cases[] = {
      {"remedies: {loss_spike: {spike_factor: 1}}\n", "spec.remedies.loss_spike.spike_factor"},
      {"remedies: {loss_spike: {window: 1}}\n", "spec.remedies.loss_spike.window"},
      {"remedies: {loss_spike: {max_rollbacks: -1}}\n", "spec.remedies.loss_spike.max_rollbacks"},
      {"remedies: {loss_spike: {max_grad_norm: 0}}\n", "spec.remedies.loss_spike.max_grad_norm"},
      {"remedies: {loss_spike: {warmup_ratio: 0}}\n", "spec.remedies.loss_spike.warmup_ratio"},
      {"remedies: {loss_spike: {warmup_ratio: 1.5}}\n", "spec.remedies.loss_spike.warmup_ratio"},
      {"remedies: {oom: maybe}\n", "spec.remedies.oom"},
      {"remedies: {leak: true}\n", "spec.remedies.leak"},
  };
  for (const Case& c : cases) {
    auto v = FromYaml(c.yaml);
    ASSERT_FALSE(v.ok()) << c.yaml;
    EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument) << c.yaml;
    EXPECT_TRUE(absl::StrContains(v.status().message(), c.error))
        << c.yaml << " -> " << v.status().message();
  }
}

TEST(RemediesSpecTest, EvalAndPipelineJobsCannotUseThem) {
  auto spec = ParseJobSpec(
      "kind: eval\nmodel_name_or_path: tiny\ndata_path: /d\noutput_dir: /o\n"
      "remedies: {loss_spike: {}}\n",
      SpecFormat::kYaml, "job.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  auto v = ValidateJobSpec(*spec);
  ASSERT_FALSE(v.ok());
  EXPECT_TRUE(absl::StrContains(v.status().message(), "spec.remedies.loss_spike: an eval job"))
      << v.status().message();
  spec = ParseJobSpec(
      "kind: pipeline\nmodel_name_or_path: tiny\ndata_path: /d\noutput_dir: /o\n"
      "stages: [{kind: sft}]\nremedies: {oom: true}\n",
      SpecFormat::kYaml, "job.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  v = ValidateJobSpec(*spec);
  ASSERT_FALSE(v.ok());
  EXPECT_TRUE(absl::StrContains(v.status().message(), "spec.remedies: not supported on pipeline"))
      << v.status().message();
}

}  // namespace
}  // namespace trainctl
