// The control plane's model shape (common/model_catalog.h), which the memory plan counts bytes
// from, against the model LibTorch builds: the same units in the same order with the same
// parameter counts, for both families. The published models' totals are checked in
// tests/common/memory_plan_test.cc.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/model_catalog.h"
#include "worker/trainer/model/qwen2vl.h"
#include "worker/trainer/model/qwen2vl_config.h"

namespace trainctl::model {
namespace {

TEST(ModelShapeTest, UnitsAndCountsEqualTheBuiltModel) {
  for (const std::string name : {"tiny", "tiny-qwen2.5-vl", "bench-30m"}) {
    auto path = FindModelConfig(name);
    ASSERT_TRUE(path.ok()) << path.status();
    auto config = LoadQwen2VLConfig(*path);
    ASSERT_TRUE(config.ok()) << config.status();
    auto shape = LookupModelShape(name);
    ASSERT_TRUE(shape.ok()) << shape.status();
    Qwen2VLForConditionalGeneration net(*config);
    std::vector<int64_t> built;
    int64_t total = 0;
    for (const ModelUnit& unit : net.Units()) {
      int64_t n = 0;
      for (const auto& [param, tensor] : unit.NamedParameters()) n += tensor.numel();
      built.push_back(n);
      total += n;
    }
    std::vector<int64_t> planned;
    for (const auto& [unit, n] : shape->Units()) planned.push_back(n);
    EXPECT_EQ(planned, built) << name;
    EXPECT_EQ(shape->Parameters(), total) << name;
    int64_t numel = 0;
    for (const auto& p : net.parameters()) numel += p.numel();
    EXPECT_EQ(total, numel) << name;
  }
}

}  // namespace
}  // namespace trainctl::model
