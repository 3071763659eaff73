// smart_resize, Pillow-exact bicubic resizing, normalisation and HF's patch order, on images small
// enough to check by hand. The bicubic goldens were produced by Pillow 9.4's
// Image.resize(..., Image.BICUBIC) on the same pixels.
#include "common/data/image_processor.h"

#include <stb/stb_image_write.h>

#include <cmath>
#include <string>
#include <vector>

#include "common/data/batch.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainctl::data {
namespace {

using ::testing::HasSubstr;

RgbImage Solid(int32_t width, int32_t height, uint8_t r, uint8_t g, uint8_t b) {
  RgbImage image{width, height, {}};
  for (int32_t i = 0; i < width * height; ++i) image.pixels.insert(image.pixels.end(), {r, g, b});
  return image;
}

std::pair<int64_t, int64_t> Resized(int64_t h, int64_t w, int64_t min_pixels = kDefaultMinPixels,
                                    int64_t max_pixels = kDefaultMaxPixels) {
  auto size = SmartResize(h, w, 28, min_pixels, max_pixels);
  EXPECT_TRUE(size.ok()) << size.status();
  return size.ok() ? std::make_pair(size->height, size->width) : std::make_pair(-1L, -1L);
}

TEST(SmartResizeTest, RoundsSidesToMultiplesOf28) {
  EXPECT_EQ(Resized(56, 56), std::make_pair(56L, 56L));
  // 100/28 = 3.57 -> 4, 200/28 = 7.14 -> 7.
  EXPECT_EQ(Resized(100, 200), std::make_pair(112L, 196L));
}

TEST(SmartResizeTest, RoundsHalvesToEvenAsPython) {
  // 42/28 = 1.5 -> 2 and 70/28 = 2.5 -> 2; 98/28 = 3.5 -> 4.
  EXPECT_EQ(Resized(42, 70), std::make_pair(56L, 56L));
  EXPECT_EQ(Resized(98, 98), std::make_pair(112L, 112L));
}

TEST(SmartResizeTest, ScalesUpToMinPixels) {
  // 28x28 = 784 < 3136: beta = 2, ceil(28 * 2 / 28) * 28 = 56.
  EXPECT_EQ(Resized(28, 28), std::make_pair(56L, 56L));
  // 30x60 -> 28x56 = 1568 < 3136: beta = sqrt(3136 / 1800) = 1.3199; 39.6 -> 56, 79.2 -> 84.
  EXPECT_EQ(Resized(30, 60), std::make_pair(56L, 84L));
  // A lower minimum leaves 28x28 alone.
  EXPECT_EQ(Resized(28, 28, 784), std::make_pair(28L, 28L));
}

TEST(SmartResizeTest, ScalesDownToMaxPixels) {
  // 1008x504 > 78400: beta = sqrt(500000 / 78400) = 2.5254; 395.98 / 28 -> 14, 197.99 / 28 -> 7.
  EXPECT_EQ(Resized(1000, 500, 3136, 28 * 28 * 100), std::make_pair(392L, 196L));
  const auto [h, w] = Resized(4000, 3000);
  EXPECT_LE(h * w, kDefaultMaxPixels);
  EXPECT_EQ(h % 28, 0);
  EXPECT_EQ(w % 28, 0);
}

TEST(SmartResizeTest, RefusesWhatHfRefuses) {
  EXPECT_THAT(SmartResize(20, 100).status().message(), HasSubstr("at least 28"));
  EXPECT_THAT(SmartResize(28, 6000).status().message(), HasSubstr("aspect ratio"));
  EXPECT_FALSE(SmartResize(56, 56, 28, 100, 50).ok());
}

TEST(NormalizeTest, MatchesClipMeanAndStd) {
  // (v / 255 - mean) / std, by hand.
  EXPECT_NEAR(NormalizedValue(255, 0), (1.0 - 0.48145466) / 0.26862954, 1e-6);  // 1.9303361
  EXPECT_NEAR(NormalizedValue(0, 1), -0.4578275 / 0.26130258, 1e-6);            // -1.7520971
  EXPECT_NEAR(NormalizedValue(128, 2), (128 / 255.0 - 0.40821073) / 0.27577711, 1e-6);
  // HF computes in float32: rescale in float64 cast to float32, then (x - mean) / std.
  const float rescaled = static_cast<float>(128 * (1.0 / 255.0));
  EXPECT_EQ(NormalizedValue(128, 2), (rescaled - 0.40821073f) / 0.27577711f);
}

TEST(ResizeBicubicTest, MatchesPillowDownAndUp) {
  RgbImage image{5, 4, {}};
  for (int y = 0; y < 4; ++y) {
    for (int x = 0; x < 5; ++x) {
      for (int c = 0; c < 3; ++c) image.pixels.push_back((x * 50 + y * 30 + c * 70) % 256);
    }
  }
  EXPECT_THAT(ResizeBicubic(image, 2, 3).pixels,
              ::testing::ElementsAreArray({36, 106, 188, 118, 198, 126, 187, 111, 75, 90, 168, 186,
                                           182, 126, 76, 118, 70, 134}));
  const std::vector<uint8_t> up = {
      0,   64,  134, 15,  85,  154, 51,  121, 193, 82,  152, 255, 114, 192, 198, 145, 222, 39,
      181, 96,  51,  202, 0,   86,  10,  78,  148, 29,  99,  175, 65,  135, 202, 96,  165, 159,
      128, 211, 102, 159, 251, 48,  204, 117, 72,  232, 11,  100, 31,  101, 171, 52,  122, 207,
      88,  158, 221, 119, 194, 62,  152, 222, 4,   183, 229, 64,  199, 119, 103, 207, 36,  123,
      51,  121, 190, 72,  141, 232, 108, 179, 254, 139, 238, 95,  178, 192, 33,  208, 56,  85,
      102, 52,  122, 27,  71,  143, 74,  144, 224, 95,  172, 187, 131, 196, 127, 162, 143, 74,
      202, 81,  69,  232, 27,  108, 97,  62,  145, 0,   97,  166, 88,  158, 248, 109, 193, 140,
      145, 205, 5,   176, 46,  47,  216, 0,   93,  246, 51,  123, 120, 90,  159, 20,  110, 180};
  EXPECT_EQ(ResizeBicubic(image, 6, 8).pixels, up);
}

TEST(ResizeBicubicTest, KeepsASolidColourExactly) {
  const RgbImage image = Solid(31, 45, 200, 17, 99);
  EXPECT_EQ(ResizeBicubic(image, 56, 28).pixels, Solid(28, 56, 200, 17, 99).pixels);
  EXPECT_EQ(ResizeBicubic(image, 45, 31).pixels, image.pixels);
}

TEST(PreprocessImageTest, SolidImageGivesHandCheckedValues) {
  ImageProcessorOptions options;
  options.min_pixels = 28 * 28;
  auto out = PreprocessImage(Solid(28, 28, 255, 0, 128), options);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_THAT(out->grid_thw, ::testing::ElementsAre(1, 2, 2));
  EXPECT_EQ(out->num_patches(), 4);
  EXPECT_EQ(out->num_merged_tokens(), 1);
  ASSERT_EQ(out->pixel_values.size(), 4u * kPatchDim);
  // Per patch: channel-major, 2 frames x 14 x 14 = 392 values per channel.
  for (int64_t p = 0; p < 4; ++p) {
    for (int64_t i = 0; i < kPatchDim; ++i) {
      const int c = static_cast<int>(i / 392);
      const float expected = c == 0 ? 1.9303361f : c == 1 ? -1.7520971f : 0.33994877f;
      ASSERT_NEAR(out->pixel_values[p * kPatchDim + i], expected, 1e-6) << p << " " << i;
    }
  }
}

TEST(PreprocessImageTest, DefaultMinimumUpscalesTo4x4Patches) {
  auto out = PreprocessImage(Solid(28, 28, 10, 20, 30));
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_THAT(out->grid_thw, ::testing::ElementsAre(1, 4, 4));
  EXPECT_EQ(out->num_merged_tokens(), 4);
  EXPECT_EQ(out->pixel_values[0], NormalizedValue(10, 0));
  EXPECT_EQ(out->pixel_values.back(), NormalizedValue(30, 2));
}

// R = 4x, G = 4y, B = (x + y) mod 256 on a 56x56 image (not resized): every value says where
// it came from.
TEST(PreprocessImageTest, PatchesAreInHfOrder) {
  RgbImage image{56, 56, {}};
  for (int y = 0; y < 56; ++y) {
    for (int x = 0; x < 56; ++x) {
      image.pixels.insert(image.pixels.end(),
                          {static_cast<uint8_t>(4 * x), static_cast<uint8_t>(4 * y),
                           static_cast<uint8_t>((x + y) % 256)});
    }
  }
  auto out = PreprocessImage(image);
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_THAT(out->grid_thw, ::testing::ElementsAre(1, 4, 4));
  const std::vector<float>& v = out->pixel_values;
  auto at = [&v](int64_t patch, int64_t i) { return v[patch * kPatchDim + i]; };
  // Hand-computed: the 2x2 blocks the merger fuses come first. Patch 1 is (row 0, col 1), patch 2
  // is (row 1, col 0), patch 4 is (row 0, col 2), patch 15 is (row 3, col 3).
  EXPECT_EQ(at(1, 0), NormalizedValue(4 * 14, 0));    // R at x = 14
  EXPECT_EQ(at(2, 392), NormalizedValue(4 * 14, 1));  // G at y = 14
  EXPECT_EQ(at(2, 0), NormalizedValue(0, 0));         // R at x = 0
  EXPECT_EQ(at(4, 0), NormalizedValue(4 * 28, 0));    // R at x = 28
  EXPECT_EQ(at(15, 0), NormalizedValue(4 * 42, 0));
  EXPECT_EQ(at(15, 392), NormalizedValue(4 * 42, 1));
  // Within a patch: (channel, frame, row, column). Index 1 is column 1; 14 is row 1; 196 is the
  // second frame (a copy); 784 is blue.
  EXPECT_EQ(at(0, 1), NormalizedValue(4, 0));
  EXPECT_EQ(at(0, 392 + 14), NormalizedValue(4, 1));
  EXPECT_EQ(at(3, 196 + 13), at(3, 13));
  EXPECT_EQ(at(3, 784 + 14 * 13 + 13), NormalizedValue((14 + 13) * 2, 2));
  // Everywhere, by the formula.
  for (int64_t p = 0; p < 16; ++p) {
    const int64_t row = (p / 8) * 2 + (p % 4) / 2, col = ((p / 4) % 2) * 2 + p % 2;
    for (int64_t i = 0; i < kPatchDim; ++i) {
      const int c = static_cast<int>(i / 392);
      const int64_t y = row * 14 + (i % 196) / 14, x = col * 14 + i % 14;
      const int value = c == 0 ? 4 * x : c == 1 ? 4 * y : (x + y) % 256;
      ASSERT_EQ(at(p, i), NormalizedValue(static_cast<uint8_t>(value), c)) << p << " " << i;
    }
  }
}

TEST(PreprocessImageTest, RefusesTinyImages) {
  EXPECT_THAT(PreprocessImage(Solid(10, 40, 0, 0, 0)).status().message(), HasSubstr("at least 28"));
}

std::string Encode(int width, int height, int channels, const std::vector<uint8_t>& pixels,
                   bool jpeg = false) {
  std::string bytes;
  auto append = [](void* context, void* data, int size) {
    static_cast<std::string*>(context)->append(static_cast<const char*>(data), size);
  };
  if (jpeg) {
    stbi_write_jpg_to_func(append, &bytes, width, height, channels, pixels.data(), 95);
  } else {
    stbi_write_png_to_func(append, &bytes, width, height, channels, pixels.data(),
                           width * channels);
  }
  return bytes;
}

TEST(DecodeImageTest, PngRoundTripsExactly) {
  RgbImage image{3, 2, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18}};
  auto png = EncodePng(image);
  ASSERT_TRUE(png.ok());
  auto decoded = DecodeImage(*png, "x.png");
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->width, 3);
  EXPECT_EQ(decoded->height, 2);
  EXPECT_EQ(decoded->pixels, image.pixels);
}

TEST(DecodeImageTest, GreyIsReplicatedAndAlphaDropped) {
  auto grey = DecodeImage(Encode(2, 1, 1, {7, 200}), "grey.png");
  ASSERT_TRUE(grey.ok()) << grey.status();
  EXPECT_THAT(grey->pixels, ::testing::ElementsAre(7, 7, 7, 200, 200, 200));
  auto rgba = DecodeImage(Encode(1, 1, 4, {10, 20, 30, 0}), "rgba.png");
  ASSERT_TRUE(rgba.ok()) << rgba.status();
  EXPECT_THAT(rgba->pixels, ::testing::ElementsAre(10, 20, 30));
}

TEST(DecodeImageTest, ReadsJpeg) {
  const RgbImage solid = Solid(16, 8, 200, 100, 50);
  auto decoded = DecodeImage(Encode(16, 8, 3, solid.pixels, /*jpeg=*/true), "a.jpg");
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  ASSERT_EQ(decoded->pixels.size(), solid.pixels.size());
  for (size_t i = 0; i < solid.pixels.size(); ++i) {
    EXPECT_NEAR(decoded->pixels[i], solid.pixels[i], 4) << i;
  }
}

TEST(DecodeImageTest, GarbageIsAnErrorNamingTheSource) {
  auto decoded = DecodeImage("not an image", "photos/cat.png");
  EXPECT_EQ(decoded.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(decoded.status().message(), HasSubstr("photos/cat.png"));
  EXPECT_EQ(ReadImageFile("/nonexistent/x.png").status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace trainctl::data
