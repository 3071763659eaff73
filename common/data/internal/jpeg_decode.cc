#include "common/data/internal/jpeg_decode.h"

// clang-format off
#include <cstdio>  // jpeglib.h needs FILE and size_t first
#include <jpeglib.h>
#include <jerror.h>
// clang-format on

#include <csetjmp>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace trainctl::data::internal {
namespace {

struct ErrorManager {
  jpeg_error_mgr base;  // first, so the library's pointer is ours
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

void OnError(j_common_ptr cinfo) {
  auto* err = reinterpret_cast<ErrorManager*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, err->message);
  std::longjmp(err->jump, 1);
}

// Warnings are ignored as Pillow ignores them, but for image data that runs out, where libjpeg
// would pad the rest of the picture with grey: at the end of the file (Pillow refuses it too:
// "image file is truncated") or at a marker inside the scan ("premature end of data segment",
// which Pillow pads). Refusing the second keeps a few hundred bytes that claim 144 megapixels from
// costing seconds of decoding and hundreds of MB (image_decode_fuzz found one; the serve endpoint
// decodes what clients send).
void OnMessage(j_common_ptr cinfo, int level) {
  if (level < 0 &&
      (cinfo->err->msg_code == JWRN_JPEG_EOF || cinfo->err->msg_code == JWRN_HIT_MARKER)) {
    OnError(cinfo);
  }
}

// Pillow's MULDIV255 and cmyk2rgb (libImaging/Convert.c).
inline uint8_t MulDiv255(int a, int b) {
  const int t = a * b + 128;
  return static_cast<uint8_t>(((t >> 8) + t) >> 8);
}

inline uint8_t Clip8(int v) { return static_cast<uint8_t>(v < 0 ? 0 : v > 255 ? 255 : v); }

}  // namespace

bool LooksLikeJpeg(absl::string_view bytes) {
  return bytes.size() >= 3 && static_cast<uint8_t>(bytes[0]) == 0xFF &&
         static_cast<uint8_t>(bytes[1]) == 0xD8 && static_cast<uint8_t>(bytes[2]) == 0xFF;
}

absl::StatusOr<RgbImage> DecodeJpeg(absl::string_view bytes, absl::string_view source) {
  // Everything with a destructor lives outside the setjmp/longjmp region.
  RgbImage image;
  std::vector<uint8_t> row;
  jpeg_decompress_struct cinfo;
  ErrorManager err;
  cinfo.err = jpeg_std_error(&err.base);
  err.base.error_exit = OnError;
  err.base.emit_message = OnMessage;
  if (setjmp(err.jump)) {
    jpeg_destroy_decompress(&cinfo);
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": cannot decode JPEG: ", static_cast<const char*>(err.message)));
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, reinterpret_cast<const unsigned char*>(bytes.data()),
               static_cast<unsigned long>(bytes.size()));  // NOLINT(runtime/int): libjpeg's type
  jpeg_read_header(&cinfo, TRUE);
  const int64_t pixels = int64_t{cinfo.image_width} * cinfo.image_height;
  if (pixels > kMaxDecodedPixels) {
    jpeg_destroy_decompress(&cinfo);
    return absl::InvalidArgumentError(absl::StrCat(source, ": JPEG of ", cinfo.image_width, "x",
                                                   cinfo.image_height, " pixels is too large"));
  }
  // Pillow's modes: L for grey, CMYK for CMYK/YCCK, RGB otherwise (libjpeg converts YCbCr).
  const bool cmyk = cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK;
  const bool gray = cinfo.jpeg_color_space == JCS_GRAYSCALE;
  cinfo.out_color_space = cmyk ? JCS_CMYK : gray ? JCS_GRAYSCALE : JCS_RGB;
  jpeg_start_decompress(&cinfo);
  const int channels = cinfo.output_components;
  const bool invert = cmyk && cinfo.saw_Adobe_marker;  // Pillow's "CMYK;I" raw mode
  image.width = static_cast<int32_t>(cinfo.output_width);
  image.height = static_cast<int32_t>(cinfo.output_height);
  // Reserved, not filled: the pages are touched row by row as rows decode, so a header that
  // claims a huge picture over a few bytes of data fails before it costs the whole picture.
  image.pixels.reserve(static_cast<size_t>(pixels) * 3);
  row.resize(static_cast<size_t>(cinfo.output_width) * channels);
  while (cinfo.output_scanline < cinfo.output_height) {
    JSAMPROW rows[1] = {row.data()};
    if (jpeg_read_scanlines(&cinfo, rows, 1) != 1) {  // a memory source never suspends
      jpeg_destroy_decompress(&cinfo);
      return absl::InvalidArgumentError(absl::StrCat(source, ": cannot decode JPEG: no scanline"));
    }
    const size_t at = image.pixels.size();
    image.pixels.resize(at + size_t{cinfo.output_width} * 3);
    uint8_t* out = image.pixels.data() + at;
    for (int x = 0; x < image.width; ++x, out += 3) {
      const uint8_t* in = row.data() + static_cast<size_t>(x) * channels;
      if (gray) {
        out[0] = out[1] = out[2] = in[0];
      } else if (cmyk) {
        auto value = [invert](uint8_t v) { return invert ? 255 - v : int{v}; };
        const int nk = 255 - value(in[3]);
        for (int c = 0; c < 3; ++c) out[c] = Clip8(nk - MulDiv255(value(in[c]), nk));
      } else {
        out[0] = in[0];
        out[1] = in[1];
        out[2] = in[2];
      }
    }
  }
  jpeg_finish_decompress(&cinfo);
  jpeg_destroy_decompress(&cinfo);
  return image;
}

}  // namespace trainctl::data::internal
