// multipart/form-data parsing; see form_data.h.
// Tested by tests/server/form_data_test.cc; fuzzed by tests/fuzz/fuzz_form_data.cc.
#include "server/http/form_data.h"

#include <optional>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace flux2::server::http {
namespace {

// RFC 2046 section 5.1.1: at most 70; accepted up to this many, since some clients go further.
constexpr size_t kMaxBoundaryBytes = 200;

absl::Status form_error(std::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat("multipart body: ", absl::string_view(what.data(), what.size())));
}

char lower(char c) {
  return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c;
}

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (lower(a[i]) != lower(b[i])) return false;
  }
  return true;
}

std::string_view trim(std::string_view text) {
  while (!text.empty() && (text.front() == ' ' || text.front() == '\t')) text.remove_prefix(1);
  while (!text.empty() && (text.back() == ' ' || text.back() == '\t')) text.remove_suffix(1);
  return text;
}

bool is_bchar(char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
         std::string_view("'()+_,-./:=? ").find(c) != std::string_view::npos;
}

// Parameters after a media type or disposition type: `; name=token` or `; name="quoted"` (with
// backslash escapes). Calls visit(name, value) for each; false when the syntax is broken.
template <typename Visit>
bool parse_parameters(std::string_view text, Visit visit) {
  while (true) {
    text = trim(text);
    if (text.empty()) return true;
    if (text.front() != ';') return false;
    text = trim(text.substr(1));
    if (text.empty()) return true;  // a trailing ';'
    const size_t equals = text.find('=');
    if (equals == std::string_view::npos) return false;
    const std::string_view name = trim(text.substr(0, equals));
    text = trim(text.substr(equals + 1));
    std::string value;
    if (!text.empty() && text.front() == '"') {
      size_t i = 1;
      for (; i < text.size() && text[i] != '"'; ++i) {
        if (text[i] == '\\' && i + 1 < text.size()) ++i;
        value += text[i];
      }
      if (i >= text.size()) return false;  // no closing quote
      text.remove_prefix(i + 1);
    } else {
      const size_t end = text.find(';');
      value = std::string(trim(text.substr(0, end)));
      text = end == std::string_view::npos ? std::string_view() : text.substr(end);
    }
    visit(name, std::move(value));
  }
}

absl::StatusOr<std::string> boundary_of(std::string_view content_type) {
  const size_t semicolon = content_type.find(';');
  const std::string_view media_type = trim(content_type.substr(0, semicolon));
  if (!iequals(media_type, "multipart/form-data")) {
    return form_error(absl::StrCat("Content-Type is '",
                                   absl::string_view(media_type.data(), media_type.size()),
                                   "', not multipart/form-data"));
  }
  std::optional<std::string> boundary;
  const std::string_view parameters =
      semicolon == std::string_view::npos ? std::string_view() : content_type.substr(semicolon);
  if (!parse_parameters(parameters, [&](std::string_view name, std::string value) {
        if (iequals(name, "boundary")) boundary = std::move(value);
      })) {
    return form_error("the Content-Type parameters do not parse");
  }
  if (!boundary) return form_error("no boundary parameter in Content-Type");
  if (boundary->empty() || boundary->size() > kMaxBoundaryBytes || boundary->back() == ' ') {
    return form_error(absl::StrCat("the boundary must be 1..", kMaxBoundaryBytes,
                                   " characters, not ending in a space"));
  }
  for (char c : *boundary) {
    if (!is_bchar(c)) return form_error("the boundary has a character RFC 2046 does not allow");
  }
  return *std::move(boundary);
}

// Fills part->name and part->filename from the part's header lines (CRLF-separated).
absl::Status parse_part_headers(std::string_view headers, int index, FormPart* part) {
  bool disposition_seen = false;
  while (!headers.empty()) {
    const size_t end = headers.find("\r\n");
    const std::string_view line = headers.substr(0, end);
    headers = end == std::string_view::npos ? std::string_view() : headers.substr(end + 2);
    const size_t colon = line.find(':');
    if (colon == std::string_view::npos) {
      return form_error(absl::StrCat("part ", index, " has a header line without a colon"));
    }
    if (!iequals(trim(line.substr(0, colon)), "Content-Disposition")) continue;
    if (disposition_seen) {
      return form_error(absl::StrCat("part ", index, " has two Content-Disposition fields"));
    }
    disposition_seen = true;
    const std::string_view value = line.substr(colon + 1);
    const size_t semicolon = value.find(';');
    if (!iequals(trim(value.substr(0, semicolon)), "form-data")) {
      return form_error(absl::StrCat("part ", index, "'s Content-Disposition is not form-data"));
    }
    const std::string_view parameters =
        semicolon == std::string_view::npos ? std::string_view() : value.substr(semicolon);
    bool has_name = false;
    if (!parse_parameters(parameters, [&](std::string_view name, std::string text) {
          if (iequals(name, "name")) {
            part->name = std::move(text);
            has_name = true;
          } else if (iequals(name, "filename")) {
            part->filename = std::move(text);
          }
        })) {
      return form_error(absl::StrCat("part ", index, "'s Content-Disposition does not parse"));
    }
    if (!has_name || part->name.empty()) {
      return form_error(absl::StrCat("part ", index, " has no name"));
    }
  }
  if (!disposition_seen) {
    return form_error(absl::StrCat("part ", index, " has no Content-Disposition"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<FormPart>> parse_form_data(std::string_view content_type,
                                                      std::string_view body,
                                                      const FormLimits& limits) {
  absl::StatusOr<std::string> boundary = boundary_of(content_type);
  if (!boundary.ok()) return boundary.status();
  // Every delimiter but a first one at the very start is CRLF "--" boundary.
  const std::string delimiter = "\r\n--" + *boundary;
  size_t pos = 0;
  if (body.substr(0, delimiter.size() - 2) == std::string_view(delimiter).substr(2)) {
    pos = delimiter.size() - 2;
  } else {
    const size_t first = body.find(delimiter);  // after a preamble
    if (first == std::string_view::npos) {
      return form_error("no '--boundary' line (a different boundary, or not multipart?)");
    }
    pos = first + delimiter.size();
  }
  std::vector<FormPart> parts;
  while (true) {
    if (body.substr(pos, 2) == "--") return parts;  // the close delimiter; the epilogue is ignored
    const int index = static_cast<int>(parts.size()) + 1;
    while (pos < body.size() && (body[pos] == ' ' || body[pos] == '\t')) ++pos;  // padding
    if (body.substr(pos, 2) != "\r\n") {
      return form_error(absl::StrCat("the delimiter before part ", index,
                                     " is not followed by CRLF (truncated, or not CRLF lines?)"));
    }
    pos += 2;
    if (index > limits.max_parts) {
      return form_error(absl::StrCat("more than ", limits.max_parts, " parts"));
    }
    // The part's header lines end at an empty line (at once when it has none).
    // The part's header lines end at an empty line (at once when it has none), within the limit.
    size_t headers_end = pos;
    if (body.substr(pos, 2) != "\r\n") {
      const size_t window = static_cast<size_t>(limits.max_part_header_bytes) + 4;
      const size_t blank = body.substr(pos, window).find("\r\n\r\n");
      if (blank == std::string_view::npos) {
        return form_error(absl::StrCat("part ", index, "'s headers do not end within ",
                                       limits.max_part_header_bytes, " bytes"));
      }
      headers_end = pos + blank;
    }
    FormPart part;
    if (absl::Status status = parse_part_headers(body.substr(pos, headers_end - pos), index, &part);
        !status.ok()) {
      return status;
    }
    const size_t content_start = headers_end + (headers_end == pos ? 2 : 4);
    const size_t content_end = body.find(delimiter, content_start);
    if (content_end == std::string_view::npos) {
      return form_error(absl::StrCat("part ", index, " is not closed by a boundary (truncated?)"));
    }
    part.content = std::string(body.substr(content_start, content_end - content_start));
    parts.push_back(std::move(part));
    pos = content_end + delimiter.size();
  }
}

}  // namespace flux2::server::http
