// DeepSpeed-Ulysses sequence parallelism (issue 27) with real trainer ranks over Gloo: a group of
// ranks sharing each batch, each holding a slice of every sequence through the decoder, trains
// as one rank holding everything — text and image batches, a length the group does not divide,
// ZeRO stages 0 and 3, and data x sequence parallel on 4 ranks — and a long sequence's activation
// memory per rank falls with the group's size.
#include <cmath>
#include <filesystem>
#include <iostream>
#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/trainer/shapes_fixture.h"

namespace trainctl {
namespace {

using nlohmann::json;

class SequenceParallelTest : public testing::ShapesTrainingTest {
 protected:
  // An SFT spec of `world` ranks (one node) with sequence_parallel_size `sp`.
  std::string Spec(const std::string& name, int world, int sp, int stage, int batch,
                   const json& training = json::object(), const std::string& data = "") {
    json t = {{"per_device_train_batch_size", batch},
              {"gradient_accumulation_steps", 1},
              {"max_steps", 6},
              {"save_strategy", "no"},
              {"logging_steps", 1},
              {"ddp_timeout", 60}};
    t.update(training);
    json extra = {{"resources", {{"nodes", 1}, {"slots_per_node", world}}},
                  {"parallelism", {{"sequence_parallel_size", sp}}},
                  {"deepspeed_config_json", json({{"zero_optimization", {{"stage", stage}}},
                                                  {"train_micro_batch_size_per_gpu", "auto"},
                                                  {"gradient_accumulation_steps", "auto"}})
                                                .dump()}};
    if (!data.empty()) extra["data_path"] = data;
    return WriteSpec(name, dir_.path() + "/" + name, t, extra);
  }

  // Runs the ranks; rank 0's events, whose setup event must show the mesh the spec asked for.
  std::vector<json> Run(int world, const std::string& spec, const std::string& tag) {
    std::vector<json> events =
        testing::TrainRanks(world, TRAINCTL_TRAINER_BIN, spec, dir_.path() + "/" + tag);
    const int sp =
        json::parse(testing::ReadFileOrEmpty(spec))["parallelism"]["sequence_parallel_size"];
    for (const json& e : events) {
      if (e["type"] == "setup") {
        EXPECT_EQ(e["mesh"]["sequence"], sp) << tag;
        EXPECT_EQ(e["mesh"]["data"], world / sp) << tag;
      }
    }
    return events;
  }

  static void ExpectClose(const std::map<int64_t, double>& reference,
                          const std::map<int64_t, double>& got, const std::string& what) {
    testing::ExpectLossesClose(reference, got, what);
  }
};

// Shapes batches have images and rows of unequal length (padding inside the batch, lengths the
// group does not divide); every step's loss depends on the previous steps' gradients, so equal
// losses over six steps mean equal gradients too.
TEST_F(SequenceParallelTest, TwoRanksSharingEachSequenceTrainAsOne) {
  const auto one = testing::Losses(Run(1, Spec("one", 1, 1, 0, 4), "one"));
  ASSERT_EQ(one.size(), 6u);
  ExpectClose(one, testing::Losses(Run(2, Spec("sp2", 2, 2, 0, 4), "sp2")), "sp 2, stage 0");
  ExpectClose(one, testing::Losses(Run(2, Spec("sp2z3", 2, 2, 3, 4), "sp2z3")), "sp 2, stage 3");
  // Two data-parallel groups of two: each group reads half the batch.
  ExpectClose(one, testing::Losses(Run(4, Spec("dp2sp2", 4, 2, 3, 2), "dp2sp2")),
              "dp 2 x sp 2, stage 3");
  // Gradient checkpointing recomputes the exchanges in backward.
  const json ckpt = {{"gradient_checkpointing", true}};
  ExpectClose(testing::Losses(Run(1, Spec("one-ckpt", 1, 1, 0, 4, ckpt), "one-ckpt")),
              testing::Losses(Run(2, Spec("sp2-ckpt", 2, 2, 3, 4, ckpt), "sp2-ckpt")),
              "sp 2, stage 3, checkpointed");
}

// Checkpoints do not depend on the mesh: a sequence-parallel run's checkpoint resumes on one rank
// without it, and one rank's on a sequence-parallel pair, with the losses of an unbroken run.
TEST_F(SequenceParallelTest, CheckpointsResumeAcrossMeshShapes) {
  const json save = {{"save_strategy", "steps"}, {"save_steps", 3}};
  const auto straight = testing::Losses(Run(1, Spec("straight", 1, 1, 0, 4, save), "straight"));
  ASSERT_EQ(straight.size(), 6u);
  const std::map<int64_t, double> tail(straight.find(4), straight.end());
  for (const auto& [from, to] : {std::pair{2, 1}, std::pair{1, 2}}) {
    const std::string first = absl::StrCat("sp", from, "to", to);
    Run(from, Spec(first, from, from, 3, 4, save), first);
    const std::string second = first + "-resumed";
    std::filesystem::copy(dir_.path() + "/" + first, dir_.path() + "/" + second,
                          std::filesystem::copy_options::recursive);
    std::filesystem::remove_all(dir_.path() + "/" + second + "/checkpoint-6");
    const auto events = Run(to, Spec(second, to, to, 0, 4, save), second);
    EXPECT_EQ(testing::ResumedFrom(events), 3) << second;
    ExpectClose(tail, testing::Losses(events), second);
  }
}

// Long prompts with short answers: the decoder's activations (eager attention's probabilities
// above all) dominate what a step adds to the model states, and the loss is small.
TEST_F(SequenceParallelTest, ActivationMemoryPerRankFallsWithTheGroupsSize) {
  std::string records;
  for (int i = 0; i < 8; ++i) {
    std::string prompt;
    for (int w = 0; w < 3000; ++w)
      absl::StrAppend(&prompt, w ? " " : "", (w * 7 + i) % 2 ? "red" : "blue");
    absl::StrAppend(&records,
                    json({{"messages",
                           {{{"role", "user"}, {"content", prompt}},
                            {{"role", "assistant"}, {"content", absl::StrCat("scene ", i)}}}}})
                        .dump(),
                    "\n");
  }
  const std::string data = dir_.path() + "/long";
  testing::RunResult prep =
      testing::Run({TRAINCTL_CLI_BIN, "prepare", "--input", dir_.Write("long.jsonl", records),
                    "--out", data, "--tokenizer", tokenizer::testing::QwenTokenizerDir()});
  ASSERT_EQ(prep.exit_code, 0) << prep.err;
  std::map<int, double> added;
  for (int sp : {1, 2, 4}) {
    const std::string name = absl::StrCat("mem", sp);
    Run(sp, Spec(name, sp, sp, 0, 1, {{"max_steps", 1}, {"max_seq_length", 4096}}, data), name);
    json memory;
    for (const json& e : testing::ReadEvents(absl::StrCat(dir_.path(), "/", name, ".0.jsonl"))) {
      if (e["type"] == "memory") memory = e;
    }
    ASSERT_TRUE(memory.is_object()) << name;
    const double states = memory["master_bytes"].get<double>() +
                          memory["optimizer_bytes"].get<double>() +
                          memory["gradient_bytes"].get<double>();
    added[sp] = memory["peak_bytes"].get<double>() - states;
    std::cout << "sp " << sp << ": peak above the model states " << added[sp] / (1 << 20)
              << " MiB, ratio to sp 1 " << added[sp] / added[1] << "\n";
  }
  // 1/sp of the decoder's activations plus what stays whole (embeddings, the gathered last
  // states, the loss, the optimizer's temporaries, the exchange buffers): measured 0.64 and 0.39
  // (2026-12-07), about 1/sp + 0.14; held under 1/sp + 0.25.
  EXPECT_LT(added[2] / added[1], 0.5 + 0.25);
  EXPECT_LT(added[4] / added[1], 0.25 + 0.25);
}

}  // namespace
}  // namespace trainctl
