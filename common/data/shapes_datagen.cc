#include "common/data/shapes_datagen.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace trainctl::data {
namespace {

constexpr int32_t kMinSide = 56, kMaxSide = 112;
constexpr int32_t kMinRadius = 8, kMaxRadius = 13;
constexpr int kKinds = 3;

// SplitMix64: small, fast, and the same everywhere.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in [lo, hi].
  int32_t Between(int32_t lo, int32_t hi) {
    const uint64_t span = static_cast<uint64_t>(hi - lo) + 1;
    const uint64_t limit = UINT64_MAX - UINT64_MAX % span;
    uint64_t x;
    do {
      x = Next();
    } while (x >= limit);
    return lo + static_cast<int32_t>(x % span);
  }

 private:
  uint64_t state_;
};

bool Overlaps(const Shape& a, const Shape& b) {
  const int64_t dx = a.cx - b.cx, dy = a.cy - b.cy;
  // Bounding circles of radius r * sqrt(2) cover squares and triangles; keep a gap of 2 pixels.
  const double reach = (a.radius + b.radius) * 1.42 + 2;
  return static_cast<double>(dx * dx + dy * dy) < reach * reach;
}

ShapesScene MakeScene(Rng* rng) {
  ShapesScene scene;
  scene.width = rng->Between(kMinSide, kMaxSide);
  scene.height = rng->Between(kMinSide, kMaxSide);
  const int wanted = rng->Between(1, 4);
  for (int attempt = 0; attempt < 200 && static_cast<int>(scene.shapes.size()) < wanted;
       ++attempt) {
    Shape s;
    s.kind = static_cast<ShapeKind>(rng->Between(0, kKinds - 1));
    s.color = rng->Between(0, static_cast<int32_t>(ShapeColors().size()) - 1);
    s.radius = rng->Between(kMinRadius, kMaxRadius);
    s.cx = rng->Between(s.radius + 1, scene.width - s.radius - 2);
    s.cy = rng->Between(s.radius + 1, scene.height - s.radius - 2);
    bool clear = true;
    for (const Shape& other : scene.shapes) clear = clear && !Overlaps(s, other);
    if (clear) scene.shapes.push_back(s);
  }
  return scene;
}

template <typename Pred>
int Count(const ShapesScene& scene, Pred pred) {
  int n = 0;
  for (const Shape& s : scene.shapes) n += pred(s) ? 1 : 0;
  return n;
}

std::string Plural(ShapeKind kind) { return absl::StrCat(ShapeKindName(kind), "s"); }

// The reasoning from the picture to the answer of `question`, short enough for the tiny model to
// learn in a demo's few steps: "2 red.", "1 circle.", "3 shapes.", "The square is blue."
std::string Reason(const std::string& question, const std::string& answer,
                   const std::string& what) {
  if (absl::StartsWith(question, "What colour")) {
    return absl::StrCat("The ", what, " is ", answer, ".");
  }
  return absl::StrCat(answer, " ", what, ".");
}

// Picks a question about `scene` and answers it from the scene.
void Ask(const ShapesScene& scene, Rng* rng, ShapesItem* item) {
  while (true) {
    switch (rng->Between(0, 3)) {
      case 0: {
        const int color = rng->Between(0, static_cast<int32_t>(ShapeColors().size()) - 1);
        item->question = absl::StrCat("How many ", ShapeColors()[color].name, " shapes are there?");
        item->answer = absl::StrCat(Count(scene, [&](const Shape& s) { return s.color == color; }));
        item->reasoning = Reason(item->question, item->answer, ShapeColors()[color].name);
        return;
      }
      case 1: {
        const auto kind = static_cast<ShapeKind>(rng->Between(0, kKinds - 1));
        item->question = absl::StrCat("How many ", Plural(kind), " are there?");
        item->answer = absl::StrCat(Count(scene, [&](const Shape& s) { return s.kind == kind; }));
        item->reasoning = Reason(item->question, item->answer,
                                 item->answer == "1" ? ShapeKindName(kind) : Plural(kind));
        return;
      }
      case 2: {
        const auto kind = static_cast<ShapeKind>(rng->Between(0, kKinds - 1));
        if (Count(scene, [&](const Shape& s) { return s.kind == kind; }) != 1) break;
        item->question = absl::StrCat("What colour is the ", ShapeKindName(kind), "?");
        for (const Shape& s : scene.shapes) {
          if (s.kind == kind) item->answer = ShapeColors()[s.color].name;
        }
        item->reasoning = Reason(item->question, item->answer, ShapeKindName(kind));
        return;
      }
      default:
        item->question = "How many shapes are there?";
        item->answer = absl::StrCat(scene.shapes.size());
        item->reasoning =
            Reason(item->question, item->answer, item->answer == "1" ? "shape" : "shapes");
        return;
    }
  }
}

bool Inside(const Shape& s, double x, double y) {
  const double dx = x - s.cx, dy = y - s.cy, r = s.radius;
  switch (s.kind) {
    case ShapeKind::kCircle:
      return dx * dx + dy * dy <= r * r;
    case ShapeKind::kSquare:
      return std::abs(dx) <= r * 0.8 && std::abs(dy) <= r * 0.8;
    case ShapeKind::kTriangle: {
      // Apex (0, -r), base from (-r, 0.8r) to (r, 0.8r): inside the base line and both sides.
      if (dy > 0.8 * r || dy < -r) return false;
      const double half_width = r * (dy + r) / (1.8 * r);
      return std::abs(dx) <= half_width;
    }
  }
  return false;
}

absl::Status WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

}  // namespace

const char* ShapeKindName(ShapeKind kind) {
  switch (kind) {
    case ShapeKind::kCircle:
      return "circle";
    case ShapeKind::kSquare:
      return "square";
    case ShapeKind::kTriangle:
      return "triangle";
  }
  return "shape";
}

const std::vector<ShapeColor>& ShapeColors() {
  static const auto* const colors = new std::vector<ShapeColor>{{"red", {220, 30, 30}},
                                                                {"green", {30, 170, 50}},
                                                                {"blue", {30, 70, 220}},
                                                                {"yellow", {235, 200, 30}}};
  return *colors;
}

ShapesItem MakeShapesItem(uint64_t seed, int64_t index) {
  Rng mixer(seed);
  Rng rng(mixer.Next() ^ (static_cast<uint64_t>(index) * 0xD1B54A32D192ED03ull));
  ShapesItem item;
  item.scene = MakeScene(&rng);
  Ask(item.scene, &rng, &item);
  return item;
}

RgbImage RenderScene(const ShapesScene& scene) {
  RgbImage image;
  image.width = scene.width;
  image.height = scene.height;
  image.pixels.assign(static_cast<size_t>(scene.width) * scene.height * 3, 255);
  for (const Shape& s : scene.shapes) {
    const uint8_t* rgb = ShapeColors()[s.color].rgb;
    for (int32_t y = s.cy - s.radius; y <= s.cy + s.radius; ++y) {
      for (int32_t x = s.cx - s.radius; x <= s.cx + s.radius; ++x) {
        if (x < 0 || y < 0 || x >= scene.width || y >= scene.height || !Inside(s, x, y)) continue;
        std::copy(rgb, rgb + 3, &image.pixels[(static_cast<size_t>(y) * scene.width + x) * 3]);
      }
    }
  }
  return image;
}

absl::Status GenerateShapes(const std::string& out_dir, int64_t n, uint64_t seed) {
  if (n < 1) return absl::InvalidArgumentError(absl::StrCat("datagen: --n must be >= 1, got ", n));
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(out_dir) / "images", ec);
  if (ec) {
    return absl::InternalError(absl::StrCat("cannot create ", out_dir, "/images: ", ec.message()));
  }
  std::string jsonl, reasoning_jsonl;
  for (int64_t i = 0; i < n; ++i) {
    const ShapesItem item = MakeShapesItem(seed, i);
    const RgbImage image = RenderScene(item.scene);
    auto png = EncodePng(image);
    if (!png.ok()) return png.status();
    const std::string relative = absl::StrFormat("images/shape-%06d.png", i);
    if (absl::Status s = WriteFile(absl::StrCat(out_dir, "/", relative), *png); !s.ok()) return s;
    nlohmann::ordered_json shapes = nlohmann::ordered_json::array();
    for (const Shape& s : item.scene.shapes) {
      shapes.push_back({{"shape", ShapeKindName(s.kind)},
                        {"color", ShapeColors()[s.color].name},
                        {"x", s.cx},
                        {"y", s.cy},
                        {"radius", s.radius}});
    }
    const nlohmann::ordered_json record = {
        {"id", i},
        {"image", relative},
        {"problem", item.question},
        {"solution", absl::StrCat("<answer>", item.answer, "</answer>")},
        {"shapes", shapes}};
    jsonl += record.dump() + "\n";
    nlohmann::ordered_json traced = record;
    traced["solution"] =
        absl::StrCat("<think>", item.reasoning, "</think>\n<answer>", item.answer, "</answer>");
    reasoning_jsonl += traced.dump() + "\n";
  }
  if (absl::Status s =
          WriteFile(absl::StrCat(out_dir, "/", kShapesReasoningJsonl), reasoning_jsonl);
      !s.ok()) {
    return s;
  }
  return WriteFile(absl::StrCat(out_dir, "/", kShapesJsonl), jsonl);
}

}  // namespace trainctl::data
