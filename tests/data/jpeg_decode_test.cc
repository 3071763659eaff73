// JPEG decoding against Pillow: each fixture (tests/data/fixtures/make_jpeg_reference.py, Debian's
// python3-pil 9.4 over libjpeg-turbo) decoded by DecodeImage must give Pillow's
// Image.open(f).convert("RGB") bytes exactly — 4:4:4, 4:2:0 (fancy upsampling), progressive,
// grey and Adobe CMYK. Broken and truncated files, and decompression bombs, are errors.
#include "worker/trainer/data/internal/jpeg_decode.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "worker/trainer/data/image_processor.h"

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
