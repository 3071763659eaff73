// JPEG decoding against Pillow: each fixture (tests/data/fixtures/make_jpeg_reference.py, Debian's
// python3-pil 9.4 over libjpeg-turbo) decoded by DecodeImage must give Pillow's
// Image.open(f).convert("RGB") bytes exactly — 4:4:4, 4:2:0 (fancy upsampling), progressive,
// grey and Adobe CMYK. Broken and truncated files, and decompression bombs, are errors.
#include "common/data/internal/jpeg_decode.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "common/data/image_processor.h"

namespace trainctl::data {
namespace {

std::string ReadFixture(const std::string& name) {
  std::ifstream in(std::string(TRAINCTL_SOURCE_DIR) + "/tests/data/fixtures/" + name,
                   std::ios::binary);
  std::stringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

class JpegMatchesPillowTest : public ::testing::TestWithParam<const char*> {};

TEST_P(JpegMatchesPillowTest, DecodesPillowsPixelsExactly) {
  const std::string name = GetParam();
  const std::string jpeg = ReadFixture(name + ".jpg");
  const std::string reference = ReadFixture(name + ".rgb");
  ASSERT_FALSE(jpeg.empty());
  ASSERT_EQ(reference.size(), 24u * 16u * 3u);
  ASSERT_TRUE(internal::LooksLikeJpeg(jpeg));
  auto image = DecodeImage(jpeg, name);
  ASSERT_TRUE(image.ok()) << image.status();
  ASSERT_EQ(image->width, 24);
  ASSERT_EQ(image->height, 16);
  int max_diff = 0;
  size_t differing = 0;
  for (size_t i = 0; i < reference.size(); ++i) {
    const int d = std::abs(int{image->pixels[i]} - int{static_cast<uint8_t>(reference[i])});
    max_diff = std::max(max_diff, d);
    differing += d != 0;
  }
  EXPECT_EQ(max_diff, 0) << differing << " of " << reference.size() << " values differ";
}

INSTANTIATE_TEST_SUITE_P(Fixtures, JpegMatchesPillowTest,
                         ::testing::Values("jpeg_444", "jpeg_420", "jpeg_progressive", "jpeg_gray",
                                           "jpeg_cmyk"));

TEST(JpegDecodeTest, RejectsTruncatedAndGarbage) {
  const std::string jpeg = ReadFixture("jpeg_420.jpg");
  auto truncated = DecodeImage(jpeg.substr(0, jpeg.size() / 2), "half.jpg");
  EXPECT_EQ(truncated.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(truncated.status().message().find("half.jpg"), std::string::npos);
  EXPECT_FALSE(DecodeImage(std::string("\xFF\xD8\xFF\xE0garbage", 11), "bad.jpg").ok());
  EXPECT_FALSE(DecodeImage(jpeg.substr(0, 3), "tiny.jpg").ok());
  std::string corrupted = jpeg;
  for (size_t i = 20; i < 200 && i < corrupted.size(); i += 3) corrupted[i] = '\x00';
  // Whatever libjpeg makes of it, it returns (a status or a picture), never crashes.
  (void)DecodeImage(corrupted, "corrupted.jpg");
}

// A JPEG whose header claims far more rows and columns than its scan holds: the data runs out at
// the end-of-image marker within the first rows ("premature end of data segment"). libjpeg would
// pad the rest with grey, costing the whole claimed picture (a 325-byte file that claims 65323 x
// 2211 took 1.4 s and 433 MB); it is refused there instead (found by image_decode_fuzz).
TEST(JpegDecodeTest, RefusesAScanThatEndsBeforeThePicture) {
  std::string jpeg = ReadFixture("jpeg_420.jpg");
  size_t sof = std::string::npos;
  for (size_t i = 0; i + 9 < jpeg.size(); ++i) {
    if (jpeg[i] == '\xFF' && (jpeg[i + 1] == '\xC0' || jpeg[i + 1] == '\xC2')) {
      sof = i;
      break;
    }
  }
  ASSERT_NE(sof, std::string::npos);
  const char side[2] = {0x27, 0x10};  // 10000, big-endian: 10000 x 10000, under Pillow's limit
  jpeg.replace(sof + 5, 2, side, 2);
  jpeg.replace(sof + 7, 2, side, 2);
  auto decoded = DecodeImage(jpeg, "claims.jpg");
  EXPECT_EQ(decoded.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(decoded.status().message().find("claims.jpg: cannot decode JPEG: Corrupt JPEG data"),
            std::string::npos)
      << decoded.status();
}

// A PNG whose header claims 16000 x 16000 pixels (under stb_image's own limit, over
// Pillow's) is refused before anything is allocated.
TEST(JpegDecodeTest, RefusesDecompressionBombs) {
  auto png = EncodePng(RgbImage{1, 1, {1, 2, 3}});
  ASSERT_TRUE(png.ok());
  std::string bomb = *png;
  const char side[4] = {0, 0, 0x3E, static_cast<char>(0x80)};  // 16000, big-endian
  bomb.replace(16, 4, side, 4);
  bomb.replace(20, 4, side, 4);
  auto decoded = DecodeImage(bomb, "bomb.png");
  EXPECT_EQ(decoded.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(decoded.status().message().find("16000x16000 pixels is too large"), std::string::npos)
      << decoded.status();
}

}  // namespace
}  // namespace trainctl::data
