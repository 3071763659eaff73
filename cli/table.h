// Aligned plain-text tables for trainctl's human output: columns padded to their widest cell,
// separated by three spaces, header first.
#ifndef TRAINCTL_CLI_TABLE_H_
#define TRAINCTL_CLI_TABLE_H_

#include <ostream>
#include <string>
#include <vector>

namespace trainctl::cli {

class Table {
 public:
  explicit Table(std::vector<std::string> header) { rows_.push_back(std::move(header)); }
  void AddRow(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  void Print(std::ostream& out) const;

 private:
  std::vector<std::vector<std::string>> rows_;
};

}  // namespace trainctl::cli

#endif  // TRAINCTL_CLI_TABLE_H_
