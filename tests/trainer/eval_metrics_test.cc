// Eval's arithmetic on hand-computed values: the unbiased pass@k estimator, the tables and the
// metric names the events carry.
#include "worker/trainer/stages/eval_metrics.h"

#include <cmath>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "worker/trainer/stages/eval.h"

namespace trainctl::trainer {
namespace {

using nlohmann::json;

TEST(PassAtKTest, MatchesTheBinomialFormulaByHand) {
  // 1 - C(n - c, k) / C(n, k).
  EXPECT_DOUBLE_EQ(PassAtK(5, 2, 1), 0.4);                    // c / n
  EXPECT_DOUBLE_EQ(PassAtK(5, 2, 2), 1.0 - 3.0 / 10.0);       // C(3,2) = 3, C(5,2) = 10
  EXPECT_NEAR(PassAtK(10, 3, 4), 1.0 - 35.0 / 210.0, 1e-12);  // C(7,4) = 35, C(10,4) = 210
  EXPECT_DOUBLE_EQ(PassAtK(5, 2, 4), 1.0);                    // n - c < k: some sample is correct
  EXPECT_DOUBLE_EQ(PassAtK(5, 2, 5), 1.0);
  EXPECT_DOUBLE_EQ(PassAtK(8, 0, 8), 0.0);
  EXPECT_DOUBLE_EQ(PassAtK(8, 8, 1), 1.0);
  EXPECT_DOUBLE_EQ(PassAtK(1, 1, 1), 1.0);
  EXPECT_DOUBLE_EQ(PassAtK(1, 0, 1), 0.0);
}

TEST(PassAtKTest, OutOfRangeArgumentsGiveZero) {
  EXPECT_EQ(PassAtK(4, 1, 5), 0.0);   // k > n
  EXPECT_EQ(PassAtK(4, 1, 0), 0.0);   // k < 1
  EXPECT_EQ(PassAtK(4, 5, 1), 0.0);   // c > n
  EXPECT_EQ(PassAtK(4, -1, 1), 0.0);  // c < 0
}

TEST(PassAtKTest, StaysFiniteForManySamples) {
  const double p = PassAtK(1000, 1, 10);
  EXPECT_TRUE(std::isfinite(p));
  EXPECT_NEAR(p, 10.0 / 1000.0, 1e-12);  // one correct sample: k / n
}

TEST(EvalTableTest, SumsPromptsIntoTheTable) {
  EvalTable table;
  table.Add({/*n=*/4, /*correct=*/1, /*format=*/4, /*length=*/20, /*reward_model=*/2.0});
  table.Add({/*n=*/4, /*correct=*/0, /*format=*/2, /*length=*/12, /*reward_model=*/-1.0});
  EXPECT_EQ(table.prompts(), 2);
  EXPECT_EQ(table.completions(), 8);
  EXPECT_DOUBLE_EQ(table.accuracy(), 1.0 / 8);
  EXPECT_DOUBLE_EQ(table.format_rate(), 6.0 / 8);
  EXPECT_DOUBLE_EQ(table.mean_completion_length(), 32.0 / 8);
  EXPECT_DOUBLE_EQ(table.reward_model_mean(), 1.0 / 8);
  EXPECT_DOUBLE_EQ(table.pass_at(1), (0.25 + 0) / 2);
  EXPECT_DOUBLE_EQ(table.pass_at(2), ((1 - 3.0 / 6.0) + 0) / 2);  // C(3,2)/C(4,2) = 3/6
  EXPECT_DOUBLE_EQ(table.pass_at(4), (1.0 + 0) / 2);

  const json j = table.ToJson(4, /*with_reward_model=*/true);
  EXPECT_EQ(j["prompts"], 2);
  EXPECT_EQ(j["completions"], 8);
  EXPECT_DOUBLE_EQ(j["pass@1"].get<double>(), 0.125);
  EXPECT_DOUBLE_EQ(j["pass@4"].get<double>(), 0.5);
  EXPECT_DOUBLE_EQ(j["reward_model_score"].get<double>(), 0.125);
  for (const char* name : {"accuracy", "format_rate", "mean_completion_length"}) {
    EXPECT_TRUE(j.contains(name)) << name;
  }
  const json greedy = table.ToJson(1, /*with_reward_model=*/false);
  EXPECT_FALSE(greedy.contains("reward_model_score"));
  EXPECT_FALSE(greedy.contains("pass@4"));
  EXPECT_TRUE(greedy.contains("pass@1"));
}

TEST(EvalTableTest, AnEmptyTableIsZeros) {
  EvalTable table;
  EXPECT_EQ(table.accuracy(), 0.0);
  EXPECT_EQ(table.pass_at(1), 0.0);
  EXPECT_EQ(table.mean_completion_length(), 0.0);
}

TEST(FlattenEvalMetricsTest, NamesOverallDatasetsAndBaseline) {
  const json doc = {
      {"overall", {{"accuracy", 0.5}, {"pass@1", 0.5}}},
      {"by_dataset", {{"math", {{"accuracy", 0.25}}}, {"charts", {{"accuracy", 0.75}}}}},
      {"baseline",
       {{"model", "base"},
        {"overall", {{"accuracy", 0.1}}},
        {"by_dataset", {{"math", {{"accuracy", 0.2}}}}}}}};
  const json values = FlattenEvalMetrics(doc);
  EXPECT_EQ(values, (json{{"accuracy", 0.5},
                          {"pass@1", 0.5},
                          {"math/accuracy", 0.25},
                          {"charts/accuracy", 0.75},
                          {"baseline/accuracy", 0.1},
                          {"baseline/math/accuracy", 0.2}}));
}

TEST(FormatEvalTableTest, PutsTheBaselineBesideTheModelRowByRow) {
  const json doc = {
      {"model", "/out/grpo"},
      {"overall",
       {{"prompts", 3}, {"completions", 12}, {"accuracy", 0.5}, {"format_rate", 1.0}}},
      {"by_dataset", {{"math", {{"accuracy", 0.25}}}, {"charts", {{"accuracy", 0.75}}}}},
      {"baseline",
       {{"model", "tiny"},
        {"overall", {{"accuracy", 0.0}, {"format_rate", 0.125}}},
        {"by_dataset", {{"math", {{"accuracy", 0.0}}}}}}}};
  EXPECT_EQ(FormatEvalTable(doc),
            "eval: 3 prompts, 12 completions\n"
            "  baseline: tiny\n"
            "  model: /out/grpo\n"
            "                                baseline         model\n"
            "  accuracy                         0.000         0.500\n"
            "  format_rate                      0.125         1.000\n"
            "dataset charts\n"
            "  accuracy                             -         0.750\n"
            "dataset math\n"
            "  accuracy                         0.000         0.250\n");
  // Without a baseline: one column.
  const json alone = {{"model", "m"}, {"overall", {{"prompts", 1}, {"accuracy", 1.0}}}};
  EXPECT_EQ(FormatEvalTable(alone),
            "eval: 1 prompts, 0 completions\n"
            "  model: m\n"
            "                                   model\n"
            "  accuracy                         1.000\n");
}

}  // namespace
}  // namespace trainctl::trainer
