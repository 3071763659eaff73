// A synthetic visual question-answering set that a small model can measurably learn: PNG pictures
// of 1-4 coloured shapes (circle, square, triangle in red, green, blue or yellow on white) with a
// question whose answer follows from the picture — "How many red shapes are there?" -> "2",
// "What colour is the square?" -> "blue" — in open-r1-multimodal's JSONL format.
//
// Item i depends only on (seed, i): the same seed gives byte-identical files.
#ifndef TRAINCTL_COMMON_DATA_SHAPES_DATAGEN_H_
#define TRAINCTL_COMMON_DATA_SHAPES_DATAGEN_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/data/image_processor.h"

namespace trainctl::data {

enum class ShapeKind { kCircle, kSquare, kTriangle };

// "circle", "square", "triangle".
const char* ShapeKindName(ShapeKind kind);

struct ShapeColor {
  const char* name;
  uint8_t rgb[3];
};
// red, green, blue, yellow.
const std::vector<ShapeColor>& ShapeColors();

struct Shape {
  ShapeKind kind = ShapeKind::kCircle;
  int color = 0;  // index into ShapeColors()
  int32_t cx = 0, cy = 0;
  int32_t radius = 0;  // half the shape's extent; shapes never overlap
};

struct ShapesScene {
  int32_t width = 0;
  int32_t height = 0;
  std::vector<Shape> shapes;
};

struct ShapesItem {
  ShapesScene scene;
  std::string question;
  std::string
      answer;  // the bare answer; the record's solution is "<answer>" + answer + "</answer>"
  // The <think> part of a reasoning trace for the same question, kept short for tiny models:
  // "2 red.", "1 circle.", "3 shapes.", "The square is blue."
  std::string reasoning;
};

// Item `index` of the set for `seed`.
ShapesItem MakeShapesItem(uint64_t seed, int64_t index);

// The scene drawn: white background, each shape filled with its colour (no antialiasing, so the
// pixel at a shape's centre is exactly its colour).
RgbImage RenderScene(const ShapesScene& scene);

// Writes `n` items to `out_dir` (created if needed): images/shape-NNNNNN.png and shapes.jsonl,
// one record per line: {"id", "image" (relative to the JSONL), "problem", "solution", "shapes"
// (the scene: [{"shape", "color", "x", "y", "radius"}], so answers can be re-derived)}; and
// shapes_reasoning.jsonl, the same records whose solution is a whole reasoning trace,
// "<think>reasoning</think>\n<answer>answer</answer>": SFT data for a teacher that answers in the
// format trace distillation and GRPO's format reward ask for.
// INVALID_ARGUMENT when n < 1; INTERNAL naming the file when writing fails.
absl::Status GenerateShapes(const std::string& out_dir, int64_t n, uint64_t seed);

inline constexpr char kShapesJsonl[] = "shapes.jsonl";
inline constexpr char kShapesReasoningJsonl[] = "shapes_reasoning.jsonl";

}  // namespace trainctl::data

#endif  // TRAINCTL_COMMON_DATA_SHAPES_DATAGEN_H_
