#include "worker/trainer/tool_request.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/data/image_processor.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "worker/trainer/model/safetensors.h"

namespace trainctl::trainer {
namespace {

using nlohmann::json;

// Rows of integers, possibly ragged.
absl::StatusOr<std::vector<std::vector<int64_t>>> IntRows(const json& request,
                                                          const std::string& field) {
  const json& rows = request[field];
  auto bad = [&field](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat("request: ", field, ": ", what));
  };
  if (!rows.is_array() || rows.empty()) return bad("expected a non-empty array of arrays");
  std::vector<std::vector<int64_t>> out;
  for (size_t r = 0; r < rows.size(); ++r) {
    const json& row = rows[r];
    if (!row.is_array() || row.empty()) {
      return bad(absl::StrCat("row ", r, " is not a non-empty array"));
    }
    out.emplace_back();
    for (const json& v : row) {
      if (!v.is_number_integer()) return bad(absl::StrCat("row ", r, " holds ", v.dump()));
      out.back().push_back(v.get<int64_t>());
    }
  }
  return out;
}

absl::Status CheckMask(const ToolRequest& out) {
  const auto& mask = out.attention_mask;
  if (mask.size() != out.input_ids.size()) {
    return absl::InvalidArgumentError("request: attention_mask: row count differs from input_ids");
  }
  for (size_t r = 0; r < mask.size(); ++r) {
    if (mask[r].size() != out.input_ids[r].size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("request: attention_mask: row ", r, " differs in length from input_ids"));
    }
    for (int64_t v : mask[r]) {
      if (v != 0 && v != 1) {
        return absl::InvalidArgumentError("request: attention_mask: entries must be 0 or 1");
      }
    }
  }
  return absl::OkStatus();
}

absl::Status LoadImages(const json& images, const std::filesystem::path& folder, ToolRequest& out) {
  if (!images.is_array()) return absl::InvalidArgumentError("request: images: expected an array");
  std::vector<torch::Tensor> pixels;
  std::vector<int64_t> grids;
  for (size_t i = 0; i < images.size(); ++i) {
    if (!images[i].is_string()) {
      return absl::InvalidArgumentError(absl::StrCat("request: images[", i, "]: expected a path"));
    }
    const std::filesystem::path file = folder / images[i].get<std::string>();
    ASSIGN_OR_RETURN(data::RgbImage image, data::ReadImageFile(file.string()));
    ASSIGN_OR_RETURN(data::ProcessedImage processed, data::PreprocessImage(image));
    const int64_t patches = processed.num_patches();
    pixels.push_back(
        torch::from_blob(processed.pixel_values.data(),
                         {patches, static_cast<int64_t>(processed.pixel_values.size()) /
                                       std::max<int64_t>(patches, 1)},
                         torch::kFloat32)
            .clone());
    for (int32_t g : processed.grid_thw) grids.push_back(g);
  }
  if (pixels.empty()) return absl::OkStatus();
  out.pixel_values = torch::cat(pixels, 0);
  out.image_grid_thw =
      torch::tensor(grids, torch::kInt64).view({static_cast<int64_t>(pixels.size()), 3});
  return absl::OkStatus();
}

absl::Status LoadPixelFile(const json& file, ToolRequest& out) {
  if (!file.is_string()) {
    return absl::InvalidArgumentError("request: pixel_values_file: expected a path");
  }
  ASSIGN_OR_RETURN(std::unique_ptr<model::SafetensorsFile> images,
                   model::SafetensorsFile::Open(file.get<std::string>()));
  ASSIGN_OR_RETURN(out.pixel_values, images->Get("pixel_values", torch::kFloat32));
  ASSIGN_OR_RETURN(out.image_grid_thw, images->Get("image_grid_thw", torch::kInt64));
  if (out.image_grid_thw.dim() != 2 || out.image_grid_thw.size(1) != 3) {
    return absl::InvalidArgumentError("request: pixel_values_file: image_grid_thw must be [n, 3]");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ToolRequest> ReadToolRequest(const std::string& path) {
  if (absl::StartsWith(absl::StripLeadingAsciiWhitespace(path), "{")) {
    return absl::InvalidArgumentError(
        "--request takes the path of a request file (REQ.json), not inline JSON: write the "
        "request to a file");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read request ", path));
  std::stringstream text;
  text << in.rdbuf();
  const json request = json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (request.is_discarded() || !request.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat("request ", path, ": not a JSON object"));
  }
  if (!request.contains("input_ids")) {
    return absl::InvalidArgumentError("request: input_ids: required field is missing");
  }
  ToolRequest out;
  ASSIGN_OR_RETURN(out.input_ids, IntRows(request, "input_ids"));
  if (request.contains("attention_mask") && !request["attention_mask"].is_null()) {
    ASSIGN_OR_RETURN(out.attention_mask, IntRows(request, "attention_mask"));
    RETURN_IF_ERROR(CheckMask(out));
  }
  const bool has_file =
      request.contains("pixel_values_file") && !request["pixel_values_file"].is_null();
  const bool has_images = request.contains("images") && !request["images"].is_null();
  if (has_file && has_images) {
    return absl::InvalidArgumentError("request: give images or pixel_values_file, not both");
  }
  if (has_file) RETURN_IF_ERROR(LoadPixelFile(request["pixel_values_file"], out));
  if (has_images) {
    const std::filesystem::path folder = std::filesystem::path(path).parent_path();
    RETURN_IF_ERROR(LoadImages(request["images"], folder, out));
  }
  return out;
}

std::vector<int64_t> MergedImageTokens(const torch::Tensor& image_grid_thw,
                                       int64_t spatial_merge_size) {
  std::vector<int64_t> merged;
  if (!image_grid_thw.defined()) return merged;
  const torch::Tensor grid = image_grid_thw.to(torch::kCPU, torch::kInt64).contiguous();
  const auto g = grid.accessor<int64_t, 2>();
  for (int64_t i = 0; i < grid.size(0); ++i) {
    merged.push_back(g[i][0] * g[i][1] * g[i][2] / (spatial_merge_size * spatial_merge_size));
  }
  return merged;
}

absl::StatusOr<std::vector<std::vector<int64_t>>> ExpandImagePads(
    const std::vector<std::vector<int64_t>>& rows, const std::vector<int64_t>& merged_tokens,
    int64_t image_pad_id, std::vector<std::vector<int64_t>>* mask) {
  const bool with_mask = mask != nullptr && !mask->empty();
  std::vector<std::vector<int64_t>> out, out_mask;
  size_t image = 0;
  for (size_t r = 0; r < rows.size(); ++r) {
    const std::vector<int64_t>& row = rows[r];
    out.emplace_back();
    out_mask.emplace_back();
    for (size_t j = 0; j < row.size();) {
      if (row[j] != image_pad_id) {
        out.back().push_back(row[j]);
        if (with_mask) out_mask.back().push_back((*mask)[r][j]);
        ++j;
        continue;
      }
      size_t end = j;
      while (end < row.size() && row[end] == image_pad_id) ++end;
      const auto run = static_cast<int64_t>(end - j);
      if (image >= merged_tokens.size()) {
        return absl::InvalidArgumentError(absl::StrCat("request: row ", r,
                                                       " holds more <|image_pad|> runs than the ",
                                                       merged_tokens.size(), " images"));
      }
      const int64_t want = merged_tokens[image];
      if (run != 1 && run != want) {
        return absl::InvalidArgumentError(
            absl::StrCat("request: row ", r, ": image ", image, " needs ", want,
                         " <|image_pad|> tokens (or a single one to expand), got ", run));
      }
      out.back().insert(out.back().end(), static_cast<size_t>(want), image_pad_id);
      if (with_mask) {
        if (run == want) {
          out_mask.back().insert(out_mask.back().end(), (*mask)[r].begin() + j,
                                 (*mask)[r].begin() + end);
        } else {
          out_mask.back().insert(out_mask.back().end(), static_cast<size_t>(want), (*mask)[r][j]);
        }
      }
      ++image;
      j = end;
    }
  }
  if (image != merged_tokens.size()) {
    return absl::InvalidArgumentError(absl::StrCat("request: ", merged_tokens.size(),
                                                   " images but ", image,
                                                   " <|image_pad|> runs in input_ids"));
  }
  if (with_mask) *mask = std::move(out_mask);
  return out;
}

}  // namespace trainctl::trainer
