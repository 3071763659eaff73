// The shapes set: byte-identical for a seed, and every answer re-derivable from the scene the
// record carries and visible in the picture.
#include "common/data/shapes_datagen.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "absl/strings/match.h"
#include "common/data/record_parser.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/temp_dir.h"

namespace trainctl::data {
namespace {

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

std::vector<nlohmann::json> Records(const std::string& dir) {
  std::vector<nlohmann::json> records;
  std::istringstream lines(ReadAll(dir + "/" + kShapesJsonl));
  for (std::string line; std::getline(lines, line);) records.push_back(nlohmann::json::parse(line));
  return records;
}

// The answer to `question` counted from the record's own "shapes", independently of the generator.
std::string Recount(const std::string& question, const nlohmann::json& shapes) {
  if (question == "How many shapes are there?") return std::to_string(shapes.size());
  for (const std::string color : {"red", "green", "blue", "yellow"}) {
    if (question == "How many " + color + " shapes are there?") {
      int n = 0;
      for (const auto& s : shapes) n += s["color"] == color;
      return std::to_string(n);
    }
  }
  for (const std::string kind : {"circle", "square", "triangle"}) {
    if (question == "How many " + kind + "s are there?") {
      int n = 0;
      for (const auto& s : shapes) n += s["shape"] == kind;
      return std::to_string(n);
    }
    if (question == "What colour is the " + kind + "?") {
      std::vector<std::string> colors;
      for (const auto& s : shapes) {
        if (s["shape"] == kind) colors.push_back(s["color"]);
      }
      return colors.size() == 1 ? colors[0] : "ambiguous";
    }
  }
  return "unknown question";
}

TEST(ShapesDatagenTest, SameSeedSameBytesOtherSeedOtherSet) {
  trainctl::testing::TempDir a, b, c;
  ASSERT_TRUE(GenerateShapes(a.path(), 12, 5).ok());
  ASSERT_TRUE(GenerateShapes(b.path(), 12, 5).ok());
  ASSERT_TRUE(GenerateShapes(c.path(), 12, 6).ok());
  EXPECT_EQ(ReadAll(a.path() + "/shapes.jsonl"), ReadAll(b.path() + "/shapes.jsonl"));
  for (int i = 0; i < 12; ++i) {
    const std::string png =
        "/images/shape-00000" + std::string(i < 10 ? "0" : "") + std::to_string(i) + ".png";
    EXPECT_EQ(ReadAll(a.path() + png), ReadAll(b.path() + png)) << png;
  }
  EXPECT_NE(ReadAll(a.path() + "/shapes.jsonl"), ReadAll(c.path() + "/shapes.jsonl"));
}

TEST(ShapesDatagenTest, AnswersFollowFromTheSceneAndThePicture) {
  trainctl::testing::TempDir dir;
  ASSERT_TRUE(GenerateShapes(dir.path(), 60, 11).ok());
  const std::vector<nlohmann::json> records = Records(dir.path());
  ASSERT_EQ(records.size(), 60u);
  std::map<std::string, int> kinds_of_question;
  for (const nlohmann::json& r : records) {
    const std::string question = r["problem"];
    const std::string solution = r["solution"];
    EXPECT_EQ(solution, "<answer>" + Recount(question, r["shapes"]) + "</answer>") << r.dump();
    const std::string kind = question.rfind("What colour", 0) == 0               ? "colour of"
                             : question == "How many shapes are there?"          ? "all"
                             : question.find(" shapes are") != std::string::npos ? "by colour"
                                                                                 : "by kind";
    kinds_of_question[kind]++;
    EXPECT_GE(r["shapes"].size(), 1u);
    EXPECT_LE(r["shapes"].size(), 4u);
    // The picture shows it: each shape's colour at its centre, white in the corner.
    auto image = ReadImageFile(dir.path() + "/" + r["image"].get<std::string>());
    ASSERT_TRUE(image.ok()) << image.status();
    EXPECT_GE(image->width, 56);
    EXPECT_LE(image->width, 112);
    EXPECT_GE(image->height, 56);
    EXPECT_LE(image->height, 112);
    EXPECT_EQ(image->pixels[0], 255);
    for (const auto& s : r["shapes"]) {
      const size_t at = (static_cast<size_t>(s["y"]) * image->width + s["x"].get<size_t>()) * 3;
      const ShapeColor* color = nullptr;
      for (const ShapeColor& c : ShapeColors()) {
        if (s["color"] == c.name) color = &c;
      }
      ASSERT_NE(color, nullptr);
      EXPECT_THAT(std::vector<uint8_t>(image->pixels.begin() + at, image->pixels.begin() + at + 3),
                  ::testing::ElementsAre(color->rgb[0], color->rgb[1], color->rgb[2]));
    }
    // And the record is open-r1 as prepare reads it.
    auto parsed = ParseRecord(r.dump());
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(parsed->format, RecordFormat::kOpenR1);
  }
  EXPECT_EQ(kinds_of_question.size(), 4u) << "each kind of question is asked";
}

// shapes_reasoning.jsonl: the same records, each solution a trace whose <think> restates the
// answer with what was asked about, and whose <answer> is the plain set's answer.
TEST(ShapesDatagenTest, ReasoningTracesRestateTheAnswerThenGiveIt) {
  trainctl::testing::TempDir dir;
  ASSERT_TRUE(GenerateShapes(dir.path(), 30, 4).ok());
  const std::vector<nlohmann::json> plain = Records(dir.path());
  std::vector<nlohmann::json> traced;
  std::ifstream in(dir.path() + "/" + kShapesReasoningJsonl);
  for (std::string line; std::getline(in, line);) traced.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(traced.size(), plain.size());
  for (size_t i = 0; i < plain.size(); ++i) {
    const std::string question = plain[i]["problem"];
    const std::string answer = Recount(question, plain[i]["shapes"]);
    EXPECT_EQ(traced[i]["problem"], plain[i]["problem"]);
    EXPECT_EQ(traced[i]["image"], plain[i]["image"]);
    std::string think;
    if (question.rfind("What colour is the ", 0) == 0) {
      const std::string kind = question.substr(19, question.size() - 20);
      think = "The " + kind + " is " + answer + ".";
    } else if (question == "How many shapes are there?") {
      think = answer + (answer == "1" ? " shape." : " shapes.");
    } else {
      // "How many red shapes are there?" -> "red"; "How many circles are there?" -> "circles".
      std::string what = question.substr(9, question.find(" are there?") - 9);
      if (absl::EndsWith(what, " shapes")) what = what.substr(0, what.size() - 7);
      if (answer == "1" && absl::EndsWith(what, "s")) what.pop_back();
      think = answer + " " + what + ".";
    }
    EXPECT_EQ(traced[i]["solution"],
              "<think>" + think + "</think>\n<answer>" + answer + "</answer>")
        << question;
  }
}

TEST(ShapesDatagenTest, RefusesAnEmptySet) {
  trainctl::testing::TempDir dir;
  EXPECT_EQ(GenerateShapes(dir.path(), 0, 1).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace trainctl::data
