// The `diagnostics:` section and the probe job kind in ValidateJobSpec (common/diagnostics_spec.h).
#include "common/diagnostics_spec.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/job_spec.h"

namespace trainctl {
namespace {

using ::testing::HasSubstr;

absl::StatusOr<ValidatedJobSpec> Validate(const std::string& yaml) {
  auto spec = ParseJobSpec(yaml, SpecFormat::kYaml, "spec.yaml");
  if (!spec.ok()) return spec.status();
  return ValidateJobSpec(*spec);
}

TEST(DiagnosticsSpecTest, AProbeJobNeedsNoModelDataOrOutput) {
  auto v = Validate("kind: probe\nresources: {nodes: 2, slots_per_node: 4}\n");
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->spec.kind(), trainctl::v1::JOB_KIND_PROBE);
  EXPECT_EQ(v->spec.name(), "probe");
  EXPECT_TRUE(RunsBandwidthProbe(v->spec));
  auto sft = Validate("kind: sft\n");
  ASSERT_FALSE(sft.ok());
  EXPECT_THAT(std::string(sft.status().message()), HasSubstr("spec.model_name_or_path: required"));
}

TEST(DiagnosticsSpecTest, ProbeSettingsAreCheckedWithTheFieldNamed) {
  auto ok = Validate(
      "kind: sft\nmodel_name_or_path: qwen2-vl-tiny\ndata_path: /d\noutput_dir: /o\n"
      "diagnostics: {bandwidth_probe: true, probe_sizes: [4096, 1048576], probe_iterations: 3}\n");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_TRUE(RunsBandwidthProbe(ok->spec));
  EXPECT_TRUE(NcclLogEnabled(ok->spec));

  auto bad = Validate(
      "kind: probe\ndiagnostics: {probe_sizes: [1024, 0, 2147483648], probe_iterations: 0}\n");
  ASSERT_FALSE(bad.ok());
  const std::string message(bad.status().message());
  EXPECT_THAT(message, HasSubstr("spec.diagnostics.probe_sizes[1]: must be in [4, 1073741824] "
                                 "bytes, got 0"));
  EXPECT_THAT(message, HasSubstr("spec.diagnostics.probe_sizes[2]"));
  EXPECT_THAT(message, HasSubstr("spec.diagnostics.probe_iterations: must be in [1, 1000], got 0"));

  auto unused = Validate(
      "kind: sft\nmodel_name_or_path: m\ndata_path: /d\noutput_dir: /o\n"
      "diagnostics: {probe_iterations: 3, nccl_log: false}\n");
  ASSERT_FALSE(unused.ok());
  EXPECT_THAT(std::string(unused.status().message()),
              HasSubstr("spec.diagnostics.bandwidth_probe: probe_sizes/probe_iterations are set "
                        "but no probe runs"));
  auto off = Validate("kind: probe\ndiagnostics: {bandwidth_probe: false}\n");
  ASSERT_FALSE(off.ok());
  EXPECT_THAT(std::string(off.status().message()), HasSubstr("cannot be false"));
}

TEST(DiagnosticsSpecTest, DefaultSweepIsOneKibToSixtyFourMibByFourOnNccl) {
  EXPECT_EQ(DefaultProbeSizes(true),
            (std::vector<int64_t>{1 << 10, 1 << 12, 1 << 14, 1 << 16, 1 << 18, 1 << 20, 1 << 22,
                                  1 << 24, 1 << 26}));
  EXPECT_EQ(DefaultProbeSizes(false).back(), 1 << 24);
}

}  // namespace
}  // namespace trainctl
