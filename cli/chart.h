// A small line chart in braille characters for the terminal (trainctl describe's loss and reward
// curves). Pure: points in, lines of text out.
#ifndef TRAINCTL_CLI_CHART_H_
#define TRAINCTL_CLI_CHART_H_

#include <string>
#include <utility>
#include <vector>

namespace trainctl::cli {

struct ChartOptions {
  int width = 60;  // plot cells; each holds 2 x 4 braille dots
  int height = 8;  // plot rows
};

// `points`: (x, y) in x order, e.g. (step, loss). Non-finite y values are left out (the line
// breaks there). Returns height + 2 lines, each ending in '\n':
//   height rows of "LABEL ┤" or "      │" then the plot (the top row labelled with the largest y,
//   the bottom row with the smallest, both "%.4g"), then the x axis "└───" and a line with the
//   first and last x under its ends. Consecutive points are joined. Empty when no point has a
//   finite y.
std::string RenderChart(const std::vector<std::pair<double, double>>& points,
                        const ChartOptions& options = ChartOptions());

}  // namespace trainctl::cli

#endif  // TRAINCTL_CLI_CHART_H_
