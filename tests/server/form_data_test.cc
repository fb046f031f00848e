// multipart/form-data parsing (server/http/form_data.h): curl's and browsers' shapes, quoted
// boundaries, boundary text inside data, preamble and epilogue, quoted names and filenames with
// escapes, and each error's message (no boundary, no name, too many parts, truncated, LF lines).
//   build-http/bin/http_transport_tests --gtest_filter='FormData*'
#include "server/http/form_data.h"

#include "gtest/gtest.h"

namespace flux2::server::http {
namespace {

constexpr char kType[] = "multipart/form-data; boundary=XyZ";

std::string part(std::string_view disposition, std::string_view content,
                 std::string_view extra = "") {
  return "--XyZ\r\nContent-Disposition: " + std::string(disposition) + "\r\n" + std::string(extra) +
         "\r\n" + std::string(content) + "\r\n";
}

std::string error_of(std::string_view type, std::string_view body, const FormLimits& limits = {}) {
  const absl::StatusOr<std::vector<FormPart>> parts = parse_form_data(type, body, limits);
  EXPECT_FALSE(parts.ok());
  if (parts.ok()) return "";
  EXPECT_EQ(parts.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(parts.status().message());
}

TEST(FormData, FieldsAndFilesInOrder) {
  const std::string body =
      part("form-data; name=\"prompt\"", "a red fox") +
      part("form-data; name=\"image[]\"; filename=\"fox.png\"",
           std::string("\x89PNG\r\n\0bytes", 13), "Content-Type: image/png\r\n") +
      "--XyZ--\r\n";
  const absl::StatusOr<std::vector<FormPart>> parts = parse_form_data(kType, body);
  ASSERT_TRUE(parts.ok()) << parts.status();
  ASSERT_EQ(parts->size(), 2u);
  EXPECT_EQ((*parts)[0].name, "prompt");
  EXPECT_EQ((*parts)[0].filename, "");
  EXPECT_EQ((*parts)[0].content, "a red fox");
  EXPECT_EQ((*parts)[1].name, "image[]");
  EXPECT_EQ((*parts)[1].filename, "fox.png");
  EXPECT_EQ((*parts)[1].content, std::string("\x89PNG\r\n\0bytes", 13));
}

TEST(FormData, QuotedBoundaryPreambleEpilogueAndBoundaryTextInData) {
  const std::string body = "preamble to ignore\r\n" +
                           part("form-data; name=n", "--XyZ inside, and \n--XyZ after a bare LF") +
                           part("form-data; name=\"empty\"", "") + "--XyZ--\r\nepilogue";
  const absl::StatusOr<std::vector<FormPart>> parts =
      parse_form_data("Multipart/Form-Data; charset=utf-8; boundary=\"XyZ\"", body);
  ASSERT_TRUE(parts.ok()) << parts.status();
  ASSERT_EQ(parts->size(), 2u);
  EXPECT_EQ((*parts)[0].name, "n");
  EXPECT_EQ((*parts)[0].content, "--XyZ inside, and \n--XyZ after a bare LF");
  EXPECT_EQ((*parts)[1].content, "");
}

TEST(FormData, QuotedNamesWithEscapesSemicolonsAndCase) {
  const std::string body =
      part("Form-Data; NAME=\"a;b\\\"c\"; filename=\"x y.png\"", "1") + "--XyZ--";
  const absl::StatusOr<std::vector<FormPart>> parts = parse_form_data(kType, body);
  ASSERT_TRUE(parts.ok()) << parts.status();
  EXPECT_EQ((*parts)[0].name, "a;b\"c");
  EXPECT_EQ((*parts)[0].filename, "x y.png");
}

TEST(FormData, CurlsLongBoundaryAndNoParts) {
  const std::string boundary = "------------------------" + std::string(150, 'd');
  const std::string body = "--" + boundary +
                           "\r\nContent-Disposition: form-data; name=\"n\"\r\n\r\n2\r\n--" +
                           boundary + "--\r\n";
  EXPECT_TRUE(parse_form_data("multipart/form-data; boundary=" + boundary, body).ok());
  const absl::StatusOr<std::vector<FormPart>> none = parse_form_data(kType, "--XyZ--\r\n");
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
}

TEST(FormData, ErrorsSayWhatIsWrong) {
  const std::string ok_end = "--XyZ--\r\n";
  EXPECT_EQ(error_of("multipart/form-data", "x"),
            "multipart body: no boundary parameter in Content-Type");
  EXPECT_EQ(error_of("application/json", "{}"),
            "multipart body: Content-Type is 'application/json', not multipart/form-data");
  EXPECT_NE(error_of("multipart/form-data; boundary=\"a\rb\"", "x").find("boundary"),
            std::string::npos);
  EXPECT_NE(error_of("multipart/form-data; boundary=" + std::string(201, 'b'), "x")
                .find("1..200 characters"),
            std::string::npos);
  EXPECT_NE(error_of(kType, "no delimiter at all").find("no '--boundary' line"), std::string::npos);
  EXPECT_EQ(error_of(kType, part("form-data; name=a", "1") + part("form-data", "2") +
                                part("form-data; name=c", "3") + ok_end),
            "multipart body: part 2 has no name");
  EXPECT_EQ(error_of(kType, part("form-data; name=\"\"", "1") + ok_end),
            "multipart body: part 1 has no name");
  EXPECT_EQ(error_of(kType, "--XyZ\r\nContent-Type: text/plain\r\n\r\nx\r\n" + ok_end),
            "multipart body: part 1 has no Content-Disposition");
  EXPECT_EQ(error_of(kType, part("attachment; name=a", "1") + ok_end),
            "multipart body: part 1's Content-Disposition is not form-data");
  EXPECT_EQ(error_of(kType, part("form-data; name=\"a", "1") + ok_end),
            "multipart body: part 1's Content-Disposition does not parse");
  EXPECT_EQ(error_of(kType, part("form-data; name=a", "1", "NoColonHere\r\n") + ok_end),
            "multipart body: part 1 has a header line without a colon");
  EXPECT_EQ(error_of(kType, "--XyZ\r\nContent-Disposition: form-data; name=a\r\n\r\ntruncated"),
            "multipart body: part 1 is not closed by a boundary (truncated?)");
  EXPECT_NE(error_of(kType, "--XyZ\nContent-Disposition: form-data; name=a\n\nx\n--XyZ--\n")
                .find("not followed by CRLF"),
            std::string::npos);
  EXPECT_NE(
      error_of(kType,
               part("form-data; name=a", "1", "X-Pad: " + std::string(9000, 'p') + "\r\n") + ok_end)
          .find("headers do not end within 8192 bytes"),
      std::string::npos);
}

TEST(FormData, PartCountLimit) {
  std::string body;
  for (int i = 0; i < 1024; ++i) body += part("form-data; name=p", "x");
  EXPECT_TRUE(parse_form_data(kType, body + "--XyZ--").ok());
  EXPECT_EQ(error_of(kType, body + part("form-data; name=p", "x") + "--XyZ--"),
            "multipart body: more than 1024 parts");
  FormLimits limits;
  limits.max_parts = 2;
  EXPECT_EQ(error_of(kType,
                     part("form-data; name=a", "") + part("form-data; name=b", "") +
                         part("form-data; name=c", "") + "--XyZ--",
                     limits),
            "multipart body: more than 2 parts");
}

}  // namespace
}  // namespace flux2::server::http
