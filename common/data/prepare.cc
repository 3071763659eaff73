#include "common/data/prepare.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/data/shard_writer.h"
#include "common/tokenizer/chat_template.h"

namespace trainctl::data {
namespace {

namespace fs = std::filesystem;
using tokenizer::ChatPart;

constexpr char kVisionStart[] = "<|vision_start|>";
constexpr char kImagePad[] = "<|image_pad|>";
constexpr char kEndOfText[] = "<|endoftext|>";

absl::Status CheckImageTokens(const Sample& sample, const std::vector<int64_t>& image_tokens,
                              const tokenizer::BpeTokenizer& tokenizer) {
  const auto start = tokenizer.TokenToId(kVisionStart);
  const auto pad = tokenizer.TokenToId(kImagePad);
  if (!start || !pad) return absl::OkStatus();  // BuildTrainingExample needs them for images
  int64_t starts = 0, pads = 0, expected = 0;
  for (const int32_t id : sample.input_ids) {
    starts += id == *start;
    pads += id == *pad;
  }
  for (const int64_t n : image_tokens) expected += n;
  if (starts != static_cast<int64_t>(image_tokens.size()) || pads != expected) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the text holds vision special tokens of its own (", starts, " <|vision_start|> and ", pads,
        " <|image_pad|> for ", image_tokens.size(), " image(s) needing ", expected, ")"));
  }
  return absl::OkStatus();
}

// One record's outcome, filled by a worker thread.
struct Prepared {
  absl::Status status;
  Sample sample;
  bool truncated = false;
  bool dropped = false;
};

Prepared PrepareLine(const std::string& line, const std::string& jsonl_dir,
                     const PrepareOptions& options, const tokenizer::BpeTokenizer& tokenizer) {
  Prepared out;
  auto record = ParseRecord(line);
  if (!record.ok()) {
    out.status = record.status();
    return out;
  }
  auto sample = BuildSample(*record, jsonl_dir, options, tokenizer);
  if (!sample.ok()) {
    out.status = sample.status();
    return out;
  }
  out.sample = std::move(*sample);
  const int64_t len = static_cast<int64_t>(out.sample.input_ids.size());
  if (options.max_seq_len > 0 && len > options.max_seq_len) {
    if (options.overflow == Overflow::kDrop) {
      out.dropped = true;
      return out;
    }
    auto kept = TruncateSample(options.max_seq_len, tokenizer, &out.sample);
    if (!kept.ok()) {
      out.status = kept.status();
      return out;
    }
    out.truncated = *kept;
    out.dropped = !*kept;
  }
  return out;
}

// Runs PrepareLine over `lines` on `threads` threads; results in input order. Chunks are kept
// small (4 records a thread) because one large image can hold tens of MB of patches.
std::vector<Prepared> PrepareChunk(const std::vector<std::string>& lines,
                                   const std::string& jsonl_dir, const PrepareOptions& options,
                                   const tokenizer::BpeTokenizer& tokenizer, int threads) {
  std::vector<Prepared> results(lines.size());
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i = next++; i < lines.size(); i = next++) {
      results[i] = PrepareLine(lines[i], jsonl_dir, options, tokenizer);
    }
  };
  std::vector<std::thread> pool;
  const int n = std::min<int>(threads, static_cast<int>(lines.size()));
  for (int t = 1; t < n; ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
  return results;
}

// Removes the temporary directory unless released.
class TempDirGuard {
 public:
  explicit TempDirGuard(std::string path) : path_(std::move(path)) {}
  ~TempDirGuard() {
    if (path_.empty()) return;
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  void Release() { path_.clear(); }

 private:
  std::string path_;
};

absl::Status FsyncDir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return absl::InternalError(absl::StrCat("cannot open directory ", dir));
  ::fsync(fd);
  ::close(fd);
  return absl::OkStatus();
}

std::string UniqueSuffix() {
  std::random_device device;
  return absl::StrCat(::getpid(), "-", device() % 1000000);
}

// Moves the finished `tmp` to `out`, replacing what is there when `overwrite`.
absl::Status Publish(const std::string& tmp, const std::string& out, bool overwrite) {
  std::error_code ec;
  std::string old;
  if (fs::exists(out, ec)) {
    if (!overwrite) {
      return absl::FailedPreconditionError(absl::StrCat(out, " exists (pass --overwrite)"));
    }
    old = absl::StrCat(out, ".old-", UniqueSuffix());
    fs::rename(out, old, ec);
    if (ec) return absl::InternalError(absl::StrCat("cannot move ", out, ": ", ec.message()));
  }
  fs::rename(tmp, out, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot rename to ", out, ": ", ec.message()));
  if (!old.empty()) fs::remove_all(old, ec);
  return FsyncDir(fs::absolute(out).parent_path().string());
}

absl::Status CheckOptions(const PrepareOptions& o) {
  if (o.inputs.empty()) return absl::InvalidArgumentError("prepare: no input JSONL file");
  if (o.out_dir.empty()) return absl::InvalidArgumentError("prepare: no output directory");
  if (o.max_seq_len < 0 || o.shard_size_bytes < 1 || o.num_threads < 0) {
    return absl::InvalidArgumentError(
        "prepare: max_seq_len, shard size and thread count must not be negative");
  }
  if (o.image.min_pixels < 1 || o.image.max_pixels < o.image.min_pixels) {
    return absl::InvalidArgumentError(absl::StrCat("prepare: need 1 <= min_pixels <= max_pixels, ",
                                                   "got ", o.image.min_pixels, " and ",
                                                   o.image.max_pixels));
  }
  return absl::OkStatus();
}

// Reads up to `max` non-blank lines into `lines`, their line numbers into `numbers`.
void ReadChunk(std::istream& in, size_t max, int64_t* line_no, std::vector<std::string>* lines,
               std::vector<int64_t>* numbers) {
  lines->clear();
  numbers->clear();
  std::string line;
  while (lines->size() < max && std::getline(in, line)) {
    ++*line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    lines->push_back(std::move(line));
    numbers->push_back(*line_no);
  }
}

}  // namespace

absl::StatusOr<std::string> ResolveImagePath(std::string path, const std::string& jsonl_dir,
                                             const std::string& image_root) {
  if (absl::StartsWith(path, "file://")) path = path.substr(7);
  if (absl::StartsWith(path, "http://") || absl::StartsWith(path, "https://")) {
    return absl::InvalidArgumentError(absl::StrCat(
        "image '", path, "' is a URL; prepare reads local files only (download it first)"));
  }
  if (path.empty()) return absl::InvalidArgumentError("empty image path");
  std::vector<std::string> tried;
  if (fs::path(path).is_absolute()) {
    tried.push_back(path);
  } else {
    if (!image_root.empty()) tried.push_back((fs::path(image_root) / path).string());
    tried.push_back((fs::path(jsonl_dir) / path).string());
  }
  std::error_code ec;
  for (const std::string& candidate : tried) {
    if (fs::is_regular_file(candidate, ec)) return candidate;
  }
  return absl::NotFoundError(
      absl::StrCat("image '", path, "' not found (looked for ", absl::StrJoin(tried, ", "), ")"));
}

absl::StatusOr<Sample> BuildSample(const ParsedRecord& record, const std::string& jsonl_dir,
                                   const PrepareOptions& options,
                                   const tokenizer::BpeTokenizer& tokenizer) {
  Sample sample;
  std::vector<int64_t> image_tokens;
  for (const std::string& path : record.images) {
    auto resolved = ResolveImagePath(path, jsonl_dir, options.image_root);
    if (!resolved.ok()) return resolved.status();
    auto image = ReadImageFile(*resolved);
    if (!image.ok()) return image.status();
    auto processed = PreprocessImage(*image, options.image);
    if (!processed.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(*resolved, ": ", processed.status().message()));
    }
    image_tokens.push_back(processed->num_merged_tokens());
    sample.image_grid_thw.push_back(processed->grid_thw);
    sample.pixel_values.insert(sample.pixel_values.end(), processed->pixel_values.begin(),
                               processed->pixel_values.end());
  }
  std::vector<tokenizer::ChatMessage> messages = record.messages;
  size_t k = 0;
  for (tokenizer::ChatMessage& m : messages) {
    for (ChatPart& part : m.content) {
      if (part.kind != ChatPart::Kind::kImage) continue;
      if (k >= image_tokens.size()) {
        return absl::InvalidArgumentError("more image parts than images");
      }
      part.image_tokens = image_tokens[k++];
    }
  }
  if (k != image_tokens.size()) return absl::InvalidArgumentError("more images than image parts");
  auto example = tokenizer::BuildTrainingExample(messages, tokenizer);
  if (!example.ok()) return example.status();
  sample.input_ids = std::move(example->input_ids);
  sample.labels = std::move(example->labels);
  sample.solution = record.solution;
  if (absl::Status s = CheckImageTokens(sample, image_tokens, tokenizer); !s.ok()) return s;
  return sample;
}

absl::StatusOr<bool> TruncateSample(int64_t max_seq_len, const tokenizer::BpeTokenizer& tokenizer,
                                    Sample* sample) {
  const auto start = tokenizer.TokenToId(kVisionStart);
  if (!start || !tokenizer.TokenToId(kImagePad)) {
    return absl::FailedPreconditionError("the tokenizer lacks <|vision_start|> or <|image_pad|>");
  }
  int64_t cut = std::min<int64_t>(max_seq_len, static_cast<int64_t>(sample->input_ids.size()));
  // Image k is <|vision_start|>, its pads, <|vision_end|> from the k-th <|vision_start|> on.
  size_t images_kept = 0;
  int64_t patches_kept = 0;
  size_t k = 0;
  for (int64_t i = 0;
       i < static_cast<int64_t>(sample->input_ids.size()) && k < sample->image_grid_thw.size();
       ++i) {
    if (sample->input_ids[i] != *start) continue;
    const auto& g = sample->image_grid_thw[k];
    const int64_t patches = int64_t{g[0]} * g[1] * g[2];
    const int64_t end = i + 2 + patches / (kMergeSize * kMergeSize);
    if (i >= cut) break;
    if (end > cut) {
      cut = i;
      break;
    }
    ++images_kept;
    patches_kept += patches;
    ++k;
  }
  sample->input_ids.resize(static_cast<size_t>(cut));
  sample->labels.resize(static_cast<size_t>(cut));
  sample->image_grid_thw.resize(images_kept);
  sample->pixel_values.resize(static_cast<size_t>(patches_kept * kPatchDim));
  return std::any_of(sample->labels.begin(), sample->labels.end(),
                     [](int32_t l) { return l != tokenizer::kIgnoreLabel; });
}

absl::StatusOr<DatasetManifest> PrepareDataset(const PrepareOptions& options) {
  if (absl::Status s = CheckOptions(options); !s.ok()) return s;
  auto tokenizer = tokenizer::BpeTokenizer::Load(options.tokenizer_path);
  if (!tokenizer.ok()) return tokenizer.status();
  return PrepareDataset(options, **tokenizer);
}

absl::StatusOr<DatasetManifest> PrepareDataset(const PrepareOptions& options,
                                               const tokenizer::BpeTokenizer& tokenizer) {
  if (absl::Status s = CheckOptions(options); !s.ok()) return s;
  std::error_code ec;
  if (fs::exists(options.out_dir, ec) && !options.overwrite) {
    return absl::FailedPreconditionError(
        absl::StrCat(options.out_dir, " exists (pass --overwrite to replace it)"));
  }
  for (const std::string& input : options.inputs) {
    if (!fs::is_regular_file(input, ec)) {
      return absl::NotFoundError(absl::StrCat("input ", input, " not found"));
    }
  }
  const fs::path out = fs::absolute(options.out_dir);
  fs::create_directories(out.parent_path(), ec);
  const std::string tmp = absl::StrCat(out.string(), ".tmp-", UniqueSuffix());
  if (!fs::create_directory(tmp, ec)) {
    return absl::InternalError(absl::StrCat("cannot create ", tmp, ": ", ec.message()));
  }
  TempDirGuard guard(tmp);

  DatasetManifest manifest;
  manifest.inputs = options.inputs;
  manifest.tokenizer = options.tokenizer_path;
  manifest.min_pixels = options.image.min_pixels;
  manifest.max_pixels = options.image.max_pixels;
  manifest.max_seq_len = options.max_seq_len;
  manifest.overflow = options.overflow == Overflow::kDrop ? "drop" : "truncate";
  manifest.pad_token_id = tokenizer.TokenToId(kEndOfText).value_or(-1);

  const int threads = options.num_threads > 0
                          ? options.num_threads
                          : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  ShardWriter writer(tmp, {options.patch_dtype, options.shard_size_bytes});
  std::vector<std::string> lines;
  std::vector<int64_t> numbers;
  for (const std::string& input : options.inputs) {
    std::ifstream in(input, std::ios::binary);
    if (!in) return absl::NotFoundError(absl::StrCat("cannot read input ", input));
    const std::string jsonl_dir = fs::absolute(input).parent_path().string();
    int64_t line_no = 0;
    while (true) {
      ReadChunk(in, static_cast<size_t>(threads) * 4, &line_no, &lines, &numbers);
      if (lines.empty()) break;
      std::vector<Prepared> results = PrepareChunk(lines, jsonl_dir, options, tokenizer, threads);
      for (size_t i = 0; i < results.size(); ++i) {
        ++manifest.records;
        Prepared& r = results[i];
        if (!r.status.ok()) {
          if (!options.skip_bad) {
            return absl::Status(r.status.code(),
                                absl::StrCat(input, ":", numbers[i], ": ", r.status.message()));
          }
          ++manifest.skipped;
          if (manifest.skipped_records.size() < kMaxListedSkips) {
            manifest.skipped_records.push_back(
                {input, numbers[i], std::string(r.status.message())});
          }
          continue;
        }
        if (r.dropped) {
          ++manifest.dropped;
          continue;
        }
        manifest.truncated += r.truncated;
        if (absl::Status s = writer.Add(r.sample); !s.ok()) {
          return absl::Status(s.code(), absl::StrCat(input, ":", numbers[i], ": ", s.message()));
        }
      }
    }
    if (in.bad()) return absl::InternalError(absl::StrCat("error reading ", input));
  }
  auto written = writer.Finish(std::move(manifest));
  if (!written.ok()) return written.status();
  if (absl::Status s = Publish(tmp, out.string(), options.overwrite); !s.ok()) return s;
  guard.Release();
  return written;
}

}  // namespace trainctl::data
