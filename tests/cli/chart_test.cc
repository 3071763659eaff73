// The braille chart of describe, dot for dot.
#include "cli/chart.h"

#include <cmath>

#include "gtest/gtest.h"

namespace trainctl::cli {
namespace {

TEST(RenderChartTest, ADiagonalJoinsItsPointsDotByDot) {
  // 2 x 2 cells = 4 x 8 dots; (1, 1) is the top left dot, (2, 0) the bottom right; the line
  // between them passes two dots a row pair: ⢣ is dots 1, 2, 6 and 8.
  EXPECT_EQ(RenderChart({{1, 1.0}, {2, 0.0}}, {2, 2}),
            "1 ┤⢣ \n"
            "0 ┤ ⢣\n"
            "  └──\n"
            "   1 2\n");
}

TEST(RenderChartTest, LabelsAlignAndTheLastStepEndsUnderThePlot) {
  // 20 x 12 dots: (0, 2.5) is dot (0, 0), (100, 0.125) dot (10, 11), (200, 0.0625) dot (19, 11).
  // The dive is Bresenham's (0,0) (1,1) .. (5,5) (5,6) (6,7) .. (10,11), then flat along row 11.
  const std::string chart = RenderChart({{0, 2.5}, {100, 0.125}, {200, 0.0625}}, {10, 3});
  EXPECT_EQ(chart,
            "   2.5 ┤⠑⢄        \n"
            "       │  ⠱⡀      \n"
            "0.0625 ┤   ⠈⠢⣀⣀⣀⣀⣀\n"
            "       └──────────\n"
            "        0      200\n");
}

TEST(RenderChartTest, AFlatSeriesSitsInTheMiddleAndGapsBreakTheLine) {
  EXPECT_EQ(RenderChart({{0, 5}, {10, 5}}, {3, 2}),
            "5 ┤   \n"
            "5 ┤⠉⠉⠉\n"
            "  └───\n"
            "   0 10\n");
  // A NaN between two points: each is a lone dot, top left and bottom right.
  EXPECT_EQ(RenderChart({{0, 1}, {1, std::nan("")}, {3, 0}}, {2, 2}),
            "1 ┤⠁ \n"
            "0 ┤ ⢀\n"
            "  └──\n"
            "   0 3\n");
}

TEST(RenderChartTest, NothingToDraw) {
  EXPECT_EQ(RenderChart({}), "");
  EXPECT_EQ(RenderChart({{1, std::nan("")}}), "");
}

}  // namespace
}  // namespace trainctl::cli
