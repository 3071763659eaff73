// watch's live line and ls's progress pieces, character for character.
#include "cli/progress_line.h"

#include <cmath>
#include <limits>

#include "gtest/gtest.h"

namespace trainctl::cli {
namespace {

std::string Repeat(const std::string& s, int n) {
  std::string out;
  for (int i = 0; i < n; ++i) out += s;
  return out;
}

TEST(FormatDurationTest, PicksTwoUnits) {
  EXPECT_EQ(FormatDuration(0), "0s");
  EXPECT_EQ(FormatDuration(-5), "0s");
  EXPECT_EQ(FormatDuration(42.4), "42s");
  EXPECT_EQ(FormatDuration(59.6), "1m00s");
  EXPECT_EQ(FormatDuration(185), "3m05s");
  EXPECT_EQ(FormatDuration(2 * 3600 + 7 * 60 + 30), "2h07m");
  EXPECT_EQ(FormatDuration(3 * 86400 + 4 * 3600 + 59), "3d04h");
  EXPECT_EQ(FormatDuration(std::numeric_limits<double>::quiet_NaN()), "-");
  EXPECT_EQ(FormatDuration(std::numeric_limits<double>::infinity()), "-");
}

TEST(ProgressBarTest, FullCellsThenEighthsThenSpaces) {
  EXPECT_EQ(ProgressBar(0, 4), "    ");
  EXPECT_EQ(ProgressBar(1, 4), "████");
  EXPECT_EQ(ProgressBar(0.65, 10), "██████▌   ");
  EXPECT_EQ(ProgressBar(0.5 + 1.0 / 32, 4), "██▏ ");
  EXPECT_EQ(ProgressBar(1.7, 3), "███");  // clamped
  EXPECT_EQ(ProgressBar(-1, 3), "   ");
  EXPECT_EQ(ProgressBar(std::nan(""), 2), "  ");
  EXPECT_EQ(ProgressBar(0.5, 0), "");
}

TEST(FormatRateTest, ThreeSignificantDigits) {
  EXPECT_EQ(FormatRate(950), "950");
  EXPECT_EQ(FormatRate(1234.5), "1.23k");
  EXPECT_EQ(FormatRate(4.56e6), "4.56M");
  EXPECT_EQ(FormatRate(0.125), "0.125");
}

ProgressView Running() {
  ProgressView v;
  v.job_id = "job-3";
  v.state = "running";
  v.step = 120;
  v.total_steps = 300;
  v.loss = 0.3214;
  v.has_loss = true;
  v.tokens_per_second = 1234.5;
  v.eta_seconds = 125;
  v.elapsed_seconds = 83;
  return v;
}

TEST(FormatProgressLineTest, EverythingOnAWideTerminal) {
  const std::string line = FormatProgressLine(Running(), 119);
  EXPECT_EQ(line, "job-3 running  step 120/300 ▕" + Repeat("█", 12) + std::string(18, ' ') +
                      "▏ 40%  loss 0.3214  1.23k tok/s  ETA 2m05s  elapsed 1m23s");
  EXPECT_EQ(DisplayWidth(line), 27u + 33u + 56u);
}

TEST(FormatProgressLineTest, NarrowTerminalsShrinkTheBarThenDropFigures) {
  // 100 cells: a 14-cell bar.
  EXPECT_EQ(FormatProgressLine(Running(), 100),
            "job-3 running  step 120/300 ▕" + Repeat("█", 5) + "▌" + std::string(8, ' ') +
                "▏ 40%  loss 0.3214  1.23k tok/s  ETA 2m05s  elapsed 1m23s");
  // 80 cells: no bar, and no elapsed time.
  EXPECT_EQ(FormatProgressLine(Running(), 80),
            "job-3 running  step 120/300 40%  loss 0.3214  1.23k tok/s  ETA 2m05s");
  // 50: the ETA outlives tokens/s and loss.
  EXPECT_EQ(FormatProgressLine(Running(), 50), "job-3 running  step 120/300 40%  ETA 2m05s");
  // 20: cut.
  EXPECT_EQ(FormatProgressLine(Running(), 20), "job-3 running  step ");
  for (int w = 1; w < 130; ++w) EXPECT_LE(DisplayWidth(FormatProgressLine(Running(), w)), w);
}

TEST(FormatProgressLineTest, UnknownPartsAreLeftOut) {
  ProgressView v;
  v.job_id = "job-9";
  v.state = "pending";
  EXPECT_EQ(FormatProgressLine(v, 80), "job-9 pending");
  v.state = "running";
  v.stage = "sft";
  v.step = 7;
  v.elapsed_seconds = 3;
  EXPECT_EQ(FormatProgressLine(v, 80), "job-9 running sft  step 7  elapsed 3s");
}

}  // namespace
}  // namespace trainctl::cli
