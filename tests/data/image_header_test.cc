// Image sizes from headers (PNG IHDR, JPEG SOFn, stb_image's info for the rest) against the sizes
// the decoders give, headers that lie about a tiny body, broken headers, and the token count the
// processor will make of a size.
#include "common/data/image_header.h"

#include <stb/stb_image_write.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "common/data/preprocessor_config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainctl::data {
namespace {

using ::testing::HasSubstr;

RgbImage Pattern(int32_t width, int32_t height) {
  RgbImage image{width, height, {}};
  for (int64_t i = 0; i < int64_t{width} * height * 3; ++i) {
    image.pixels.push_back(static_cast<uint8_t>(i * 37 % 251));
  }
  return image;
}

std::string Fixture(const std::string& name) {
  std::ifstream in(std::string(TRAINCTL_SOURCE_DIR) + "/tests/data/fixtures/" + name,
                   std::ios::binary);
  std::ostringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

// A PNG signature and an IHDR claiming `width` x `height`, and nothing else.
std::string PngHeaderOnly(uint32_t width, uint32_t height) {
  std::string png("\x89PNG\r\n\x1a\n\0\0\0\x0dIHDR", 16);
  for (uint32_t v : {width, height}) {
    for (int shift = 24; shift >= 0; shift -= 8) png.push_back(static_cast<char>(v >> shift));
  }
  png.append("\x08\x02\0\0\0\0\0\0\0", 9);  // 8-bit RGB, a CRC that nobody checked
  return png;
}

TEST(ImageHeaderTest, PngAndJpegSizesAreTheDecodersSizes) {
  const std::string png = *EncodePng(Pattern(84, 56));
  auto header = ReadImageHeader(png, "a.png");
  ASSERT_TRUE(header.ok()) << header.status();
  EXPECT_EQ(header->width, 84);
  EXPECT_EQ(header->height, 56);
  for (const char* name :
       {"jpeg_420.jpg", "jpeg_444.jpg", "jpeg_cmyk.jpg", "jpeg_gray.jpg", "jpeg_progressive.jpg"}) {
    const std::string bytes = Fixture(name);
    ASSERT_FALSE(bytes.empty()) << name;
    auto decoded = DecodeImage(bytes, name);
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    auto jpeg = ReadImageHeader(bytes, name);
    ASSERT_TRUE(jpeg.ok()) << jpeg.status();
    EXPECT_EQ(jpeg->width, decoded->width) << name;
    EXPECT_EQ(jpeg->height, decoded->height) << name;
  }
}

TEST(ImageHeaderTest, OtherFormatsThroughStbInfo) {
  const RgbImage image = Pattern(30, 29);
  std::string bmp;
  stbi_write_bmp_to_func(
      [](void* context, void* data, int size) {
        static_cast<std::string*>(context)->append(static_cast<const char*>(data), size);
      },
      &bmp, image.width, image.height, 3, image.pixels.data());
  auto header = ReadImageHeader(bmp, "a.bmp");
  ASSERT_TRUE(header.ok()) << header.status();
  EXPECT_EQ(header->width, 30);
  EXPECT_EQ(header->height, 29);
}

// The header is all it reads: a 13000x13000 IHDR with no pixel data is 13000x13000.
TEST(ImageHeaderTest, HeaderOnlyPngIsItsClaimedSize) {
  auto header = ReadImageHeader(PngHeaderOnly(13000, 13000), "huge.png");
  ASSERT_TRUE(header.ok()) << header.status();
  EXPECT_EQ(header->width, 13000);
  EXPECT_EQ(header->height, 13000);
}

TEST(ImageHeaderTest, BrokenHeadersAreNamed) {
  EXPECT_THAT(ReadImageHeader(PngHeaderOnly(0, 10), "z.png").status().message(),
              HasSubstr("z.png: PNG header says 0x10 pixels"));
  EXPECT_THAT(ReadImageHeader(PngHeaderOnly(1, 1).substr(0, 20), "cut.png").status().message(),
              HasSubstr("cut.png: PNG without an IHDR chunk first"));
  EXPECT_THAT(ReadImageHeader("hello", "text").status().message(),
              HasSubstr("text: not a PNG, JPEG or other image"));
  // SOI, an APP0 segment, then SOS: no frame header before the scan.
  const std::string no_frame("\xFF\xD8\xFF\xE0\x00\x04JF\xFF\xDA\x00\x02", 12);
  EXPECT_THAT(ReadImageHeader(no_frame, "x.jpg").status().message(),
              HasSubstr("x.jpg: JPEG has no frame header (SOFn) before marker DA"));
  const std::string cut("\xFF\xD8\xFF\xE1\x01\x00JF", 8);  // APP1 says 256 bytes
  EXPECT_THAT(ReadImageHeader(cut, "cut.jpg").status().message(),
              HasSubstr("cut.jpg: JPEG segment E1 is cut short"));
  // An APP1 segment, then SOF2 (progressive) of 4000 wide, 3000 high, one component.
  const std::string sof2(
      "\xFF\xD8\xFF\xE1\x00\x04xy\xFF\xC2\x00\x0B\x08\x0B\xB8\x0F\xA0\x01\x01\x11\x00", 22);
  auto header = ReadImageHeader(sof2, "p.jpg");
  ASSERT_TRUE(header.ok()) << header.status();
  EXPECT_EQ(header->width, 4000);
  EXPECT_EQ(header->height, 3000);
}

// The count is what PreprocessImage gives, under the default and custom min/max pixels.
TEST(ImageHeaderTest, TokenCountIsThePreprocessorsCount) {
  for (const ImageProcessorOptions& options :
       {ImageProcessorOptions{}, ImageProcessorOptions{28 * 28 * 16, 28 * 28 * 40}}) {
    for (auto [w, h] : {std::pair{84, 56}, {30, 29}, {300, 100}, {500, 380}}) {
      auto processed = PreprocessImage(Pattern(w, h), options);
      ASSERT_TRUE(processed.ok()) << processed.status();
      auto count = ImageTokenCount(h, w, options);
      ASSERT_TRUE(count.ok()) << count.status();
      EXPECT_EQ(*count, processed->num_merged_tokens()) << w << "x" << h;
    }
  }
  // A 4000x4000 photo at the default max_pixels: 3584x3584, 128 x 128 merged tokens.
  EXPECT_EQ(*ImageTokenCount(4000, 4000, {}), 16384);
  EXPECT_EQ(*ImageTokenCount(4000, 4000, {3136, 401408}), 22 * 22);
  EXPECT_FALSE(ImageTokenCount(10, 4000, {}).ok());  // a side under 28
}

// preprocessor_config.json as transformers reads it: size's edges, overridden by the top-level
// min/max_pixels; no file keeps the defaults; bad values name the file and the field.
TEST(PreprocessorConfigTest, SizeThenTopLevelPixels) {
  const std::string dir = ::testing::TempDir() + "/preprocessor_config_test";
  std::filesystem::create_directories(dir);
  auto write = [&](const std::string& text) {
    std::ofstream(dir + "/preprocessor_config.json") << text;
  };
  std::filesystem::remove(dir + "/preprocessor_config.json");
  auto none = ReadPreprocessorConfig(dir);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(none->min_pixels, kDefaultMinPixels);
  EXPECT_EQ(none->max_pixels, kDefaultMaxPixels);

  write(R"({"size": {"shortest_edge": 1000, "longest_edge": 2000}})");
  auto size = ReadPreprocessorConfig(dir);
  ASSERT_TRUE(size.ok()) << size.status();
  EXPECT_EQ(size->min_pixels, 1000);
  EXPECT_EQ(size->max_pixels, 2000);

  write(R"({"size": {"shortest_edge": 1000, "longest_edge": 2000}, "max_pixels": 401408})");
  auto both = ReadPreprocessorConfig(dir);
  ASSERT_TRUE(both.ok()) << both.status();
  EXPECT_EQ(both->min_pixels, 1000);
  EXPECT_EQ(both->max_pixels, 401408);

  write(R"({"min_pixels": 0})");
  EXPECT_THAT(ReadPreprocessorConfig(dir).status().message(),
              HasSubstr("preprocessor_config.json: min_pixels: expected a positive integer"));
  write(R"({"size": {"shortest_edge": 5000, "longest_edge": 4000}})");
  EXPECT_THAT(ReadPreprocessorConfig(dir).status().message(),
              HasSubstr("max_pixels 4000 is below min_pixels 5000"));
  write("{");
  EXPECT_THAT(ReadPreprocessorConfig(dir).status().message(), HasSubstr("not a JSON object"));
}

}  // namespace
}  // namespace trainctl::data
