// A fresh directory under $TMPDIR (or /tmp) for one test, removed with everything in it.
#ifndef TRAINCTL_TESTS_TESTING_TEMP_DIR_H_
#define TRAINCTL_TESTS_TESTING_TEMP_DIR_H_

#include <string>

namespace trainctl::testing {

class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  // Writes `contents` to path()/relative (creating parent directories) and returns its full path.
  std::string Write(const std::string& relative, const std::string& contents) const;

 private:
  std::string path_;
};

}  // namespace trainctl::testing

#endif  // TRAINCTL_TESTS_TESTING_TEMP_DIR_H_
