// Unit tests of the byte-level BPE tokenizer on tiny hand-written tokenizer.json files: the
// byte-to-unicode table, merges by rank (against a naive reference), added/special tokens and their
// flags, NFC, invalid UTF-8, split-pattern iteration, load errors, truncation and padding, and the
// Qwen3 and Mistral chat templates.
// Run: build/bin/host_tests --gtest_filter='Tokenizer*:ByteLevel*:Utf8*:Bpe*:AddedTokens*:Chat*'
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "model/tokenizer.h"
#include "model/tokenizer_added_tokens.h"
#include "model/tokenizer_byte_level.h"
#include "model/tokenizer_normalizer.h"
#include "model/tokenizer_regex.h"
#include "model/tokenizer_utf8.h"
#include "nlohmann/json.hpp"
#include "tests/host/test_util.h"

namespace flux2 {
namespace {

using ::flux2::testing::TempDir;

// The Qwen2/Qwen3 split pattern, as in their tokenizer.json.
constexpr char kQwenPattern[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

std::string byte_char(unsigned char byte) {
  return byte_level_encode(std::string(1, byte));
}

// A Qwen-shaped tokenizer.json: NFC, Split(kQwenPattern) + ByteLevel, a vocabulary of the 256
// byte characters (id = byte value) followed by one token per merge (id 256 + rank) and the added
// tokens. Merges are pairs of byte-level strings.
struct TinyTokenizerSpec {
  std::vector<std::pair<std::string, std::string>> merges;
  nlohmann::json added_tokens = nlohmann::json::array();
  nlohmann::json normalizer = {{"type", "NFC"}};
};

nlohmann::json added_token(int id, const std::string& content, bool special,
                           nlohmann::json flags = nlohmann::json::object()) {
  nlohmann::json token = {{"id", id},          {"content", content}, {"single_word", false},
                          {"lstrip", false},   {"rstrip", false},    {"normalized", !special},
                          {"special", special}};
  for (const auto& [key, value] : flags.items()) token[key] = value;
  return token;
}

nlohmann::json tiny_tokenizer_json(const TinyTokenizerSpec& spec) {
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_char(static_cast<unsigned char>(b))] = b;
  nlohmann::json merges = nlohmann::json::array();
  for (size_t rank = 0; rank < spec.merges.size(); ++rank) {
    const auto& [left, right] = spec.merges[rank];
    merges.push_back(left + " " + right);
    if (!vocab.contains(left + right)) vocab[left + right] = 256 + static_cast<int>(rank);
  }
  for (const nlohmann::json& token : spec.added_tokens) {
    vocab[token["content"].get<std::string>()] = token["id"];
  }
  return {
      {"version", "1.0"},
      {"added_tokens", spec.added_tokens},
      {"normalizer", spec.normalizer},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"},
           {"pattern", {{"Regex", kQwenPattern}}},
           {"behavior", "Isolated"},
           {"invert", false}},
          {{"type", "ByteLevel"},
           {"add_prefix_space", false},
           {"trim_offsets", false},
           {"use_regex", false}}}}}},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", nullptr},
        {"continuing_subword_prefix", ""},
        {"end_of_word_suffix", ""},
        {"fuse_unk", false},
        {"byte_fallback", false},
        {"ignore_merges", false},
        {"vocab", vocab},
        {"merges", merges}}},
  };
}

void write_json(const std::string& path, const nlohmann::json& json) {
  std::ofstream(path) << json.dump();
}

std::unique_ptr<Tokenizer> load_tiny(const TempDir& dir, const TinyTokenizerSpec& spec) {
  write_json(dir.path() + "/tokenizer.json", tiny_tokenizer_json(spec));
  auto tokenizer = Tokenizer::load(dir.path());
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status();
  return tokenizer.ok() ? std::move(*tokenizer) : nullptr;
}

std::vector<int32_t> bytes_of(const std::string& text) {
  std::vector<int32_t> ids;
  for (const char c : text) ids.push_back(static_cast<unsigned char>(c));
  return ids;
}

// ---------------------------------------------------------------------------------------------
TEST(ByteLevelTest, AlphabetIsGpt2Table) {
  const auto& table = byte_level_alphabet();
  std::vector<bool> seen(0x200, false);
  for (int b = 0; b < 256; ++b) {
    ASSERT_LT(table[b], 0x200u) << b;
    EXPECT_FALSE(seen[table[b]]) << "byte " << b << " shares its code point";
    seen[table[b]] = true;
  }
  EXPECT_EQ(table['!'], U'!');
  EXPECT_EQ(table['~'], U'~');
  EXPECT_EQ(table[0xA1], 0xA1u);
  EXPECT_EQ(table[0xFF], 0xFFu);
  EXPECT_EQ(table[0x00], 0x100u);
  EXPECT_EQ(table[' '], 0x120u);   // 'Ġ'
  EXPECT_EQ(table['\n'], 0x10Au);  // 'Ċ'
  EXPECT_EQ(table[0x7F], 0x121u);
  EXPECT_EQ(table[0xA0], 0x142u);
  EXPECT_EQ(table[0xAD], 0x143u);  // the last of the 68 remapped bytes
  EXPECT_EQ(byte_level_encode("a \n\xE4\xBD\xA0"), "a\xC4\xA0\xC4\x8A\xC3\xA4\xC2\xBD\xC5\x82");
}

// ---------------------------------------------------------------------------------------------
TEST(Utf8Test, ValidTextIsUnchanged) {
  const std::string text = "plain \xC3\xA9 \xE4\xBD\xA0 \xF0\x9F\x98\x80 \xF4\x8F\xBF\xBF";
  EXPECT_EQ(utf8_replace_invalid(text), text);
  EXPECT_EQ(utf8_replace_invalid(std::string("a\0b", 3)), std::string("a\0b", 3));
}

TEST(Utf8Test, ReplacesEachMaximalSubpart) {
  const std::string fffd = "\xEF\xBF\xBD";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"\x80", fffd},      // lone continuation byte
      {"\xFF", fffd},      // never valid
      {"\xC3", fffd},      // truncated 2-byte sequence
      {"\xE2\x82", fffd},  // truncated 3-byte sequence: one replacement
      {"\xE2\x82"
       "a",
       fffd + "a"},                                     // resumes at the byte that did not fit
      {"\xF0\x9F\x98", fffd},                           // truncated 4-byte sequence
      {"\xC0\x80", fffd + fffd},                        // overlong: C0 can never start a sequence
      {"\xE0\x80\x80", fffd + fffd + fffd},             // overlong: E0 needs A0..BF next
      {"\xED\xA0\x80", fffd + fffd + fffd},             // a surrogate
      {"\xF4\x90\x80\x80", fffd + fffd + fffd + fffd},  // above U+10FFFF
      {"\xF5\x80", fffd + fffd},
      {"a\xFF"
       "b\xFE"
       "c",
       "a" + fffd + "b" + fffd + "c"},
      {"\xC3\x28", fffd + "("},
      {"\xE2\x28\xA1", fffd + "(" + fffd},
  };
  for (const auto& [input, expected] : cases) {
    EXPECT_EQ(utf8_replace_invalid(input), expected) << ::testing::PrintToString(input);
  }
}

TEST(Utf8Test, RandomBytesBecomeValidUtf8) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 2000; ++trial) {
    std::string bytes(rng() % 24, '\0');
    for (char& c : bytes) c = static_cast<char>(rng() % 4 == 0 ? 0x80 + rng() % 0x80 : rng() % 256);
    const std::string repaired = utf8_replace_invalid(bytes);
    EXPECT_EQ(utf8_replace_invalid(repaired), repaired) << "not valid after repair";
    // Decoding walks the repaired text in whole, in-range code points.
    for (size_t pos = 0; pos < repaired.size();) {
      int length = 0;
      const char32_t cp = utf8_decode(repaired, pos, &length);
      ASSERT_TRUE(cp < 0xD800 || (cp > 0xDFFF && cp <= 0x10FFFF));
      std::string again;
      utf8_append(cp, &again);
      ASSERT_EQ(again, repaired.substr(pos, length));
      pos += length;
    }
  }
}

// ---------------------------------------------------------------------------------------------
TEST(TokenizerRegexTest, WhiteSpaceRewriteFollowsOniguruma) {
  EXPECT_EQ(oniguruma_compatible_pattern("\\s+(?!\\S)"),
            "[\\t-\\r\\x{85}\\p{Z}]+(?![^\\t-\\r\\x{85}\\p{Z}])");
  EXPECT_EQ(oniguruma_compatible_pattern("[^\\s\\p{P}]"), "[^\\t-\\r\\x{85}\\p{Z}\\p{P}]");
  EXPECT_EQ(oniguruma_compatible_pattern("\\\\s[]\\s][[:alpha:]\\s]"),
            "\\\\s[]\\t-\\r\\x{85}\\p{Z}][[:alpha:]\\t-\\r\\x{85}\\p{Z}]");
  EXPECT_EQ(oniguruma_compatible_pattern("\\Q\\s\\E\\s"), "\\Q\\s\\E[\\t-\\r\\x{85}\\p{Z}]");

  auto space = TokenizerRegex::compile_regex("\\s", "test");
  ASSERT_TRUE(space.ok()) << space.status();
  for (const char* white :
       {" ", "\t", "\r", "\xC2\x85", "\xC2\xA0", "\xE3\x80\x80", "\xE2\x80\xA8"}) {
    EXPECT_EQ((*space)->find_all(white).size(), 1u) << white;
  }
  // U+180E is not White_Space since Unicode 6.3 (PCRE2's own \s still matches it); U+001C is not.
  EXPECT_TRUE((*space)->find_all("\xE1\xA0\x8E").empty());
  EXPECT_TRUE((*space)->find_all("\x1C").empty());
}

// Code points newer than PCRE2 10.42's Unicode 14.0 tables, classified as Oniguruma's Unicode 16.0
// does (tokenizer_unicode_additions.h): U+1CCF0 OUTLINED DIGIT ZERO (Nd, 16.0), U+1E4F0 NAG
// MUNDARI DIGIT ZERO (Nd, 15.0), U+11F04 KAWI LETTER A (Lo, 15.0), U+31350 the first CJK Ext. H
// ideograph (Lo, 15.0), U+0CF3 KANNADA SIGN COMBINING ANUSVARA ABOVE RIGHT (Mc, 15.0), U+1C89
// CYRILLIC CAPITAL LETTER TJE (Lu, 16.0).
TEST(TokenizerRegexTest, Unicode16CategoriesFollowOniguruma) {
  const auto matches = [](const char* pattern, const std::string& text) {
    auto regex = TokenizerRegex::compile_regex(pattern, "test");
    EXPECT_TRUE(regex.ok()) << regex.status();
    if (!regex.ok()) return std::string("error");
    std::string out;
    for (const auto& m : (*regex)->find_all(text)) {
      absl::StrAppend(&out, "[", text.substr(m.begin, m.end - m.begin), "]");
    }
    return out;
  };
  const std::string digit16 = "\xF0\x9C\xB3\xB0";  // U+1CCF0
  const std::string digit15 = "\xF0\x9E\x93\xB0";  // U+1E4F0
  const std::string kawi = "\xF0\x91\xBC\x84";     // U+11F04
  const std::string cjk_h = "\xF0\xB1\x8D\x90";    // U+31350
  const std::string mark15 = "\xE0\xB3\xB3";       // U+0CF3
  const std::string upper16 = "\xE1\xB2\x89";      // U+1C89
  EXPECT_EQ(matches("\\p{N}", "1" + digit16 + "x" + digit15),
            "[1][" + digit16 + "][" + digit15 + "]");
  EXPECT_EQ(matches("\\pN+", digit16 + digit15), "[" + digit16 + digit15 + "]");
  EXPECT_EQ(matches("\\p{Nd}", digit16), "[" + digit16 + "]");
  EXPECT_EQ(matches("\\p{No}", digit16), "");
  EXPECT_EQ(matches("\\p{L}+", "a" + kawi + cjk_h + "1"), "[a" + kawi + cjk_h + "]");
  EXPECT_EQ(matches("\\p{Lo}+", kawi + upper16), "[" + kawi + "]");
  EXPECT_EQ(matches("\\p{Lu}", kawi + upper16), "[" + upper16 + "]");
  EXPECT_EQ(matches("[\\p{M}]", mark15), "[" + mark15 + "]");
  EXPECT_EQ(matches("[^\\s\\p{L}\\p{N}]+", "!" + digit16 + kawi + "?"), "[!][?]");
  EXPECT_EQ(matches("\\P{N}+", "a" + digit16 + "b"), "[a][b]");
  // Llama 3's pattern as in Tekken's tokenizer.json: " " + U+1CCF0 is a space, then a number
  // (with PCRE2's own tables it was one punctuation-like piece; corpus entry unicode_new.03).
  EXPECT_EQ(matches("\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+", " " + digit16),
            "[ ][" + digit16 + "]");
  // Other property names pass through unchanged.
  EXPECT_EQ(oniguruma_compatible_pattern("\\p{Han}\\p{Zs}\\pP\\p{^L}[\\P{L}]"),
            "\\p{Han}\\p{Zs}\\pP\\p{^L}[\\P{L}]");
}

TEST(TokenizerRegexTest, QwenPatternSplits) {
  auto pattern = TokenizerRegex::compile_regex(kQwenPattern, "test");
  ASSERT_TRUE(pattern.ok()) << pattern.status();
  const auto pieces = [&](const std::string& text) {
    std::vector<std::string> out;
    for (const auto& m : (*pattern)->find_all(text))
      out.push_back(text.substr(m.begin, m.end - m.begin));
    return out;
  };
  using V = std::vector<std::string>;
  EXPECT_EQ(pieces("Hello world's 2024!!\n\n  x"),
            (V{"Hello", " world", "'s", " ", "2", "0", "2", "4", "!!\n\n", " ", " x"}));
  EXPECT_EQ(pieces("IT'LL a  b\t"), (V{"IT", "'LL", " a", " ", " b", "\t"}));
  EXPECT_EQ(pieces("it'\xC5\xBF"
                   "a"),
            (V{"it", "'\xC5\xBF", "a"}));  // (?i) folds long s to s
  EXPECT_EQ(pieces("x\xE1\xA0\x8E\xE1\xA0\x8Ethe"), (V{"x", "\xE1\xA0\x8E\xE1\xA0\x8E", "the"}));
  EXPECT_EQ(pieces("x\xC2\x85\xC2\x85the"), (V{"x", "\xC2\x85", "\xC2\x85the"}));
}

TEST(TokenizerRegexTest, EmptyMatchesIterateLikeOniguruma) {
  auto pattern = TokenizerRegex::compile_regex("a*", "test");
  ASSERT_TRUE(pattern.ok());
  const auto matches = (*pattern)->find_all("baa\xC3\xA9");
  std::vector<std::pair<size_t, size_t>> spans;
  for (const auto& m : matches) spans.emplace_back(m.begin, m.end);
  // An empty match at 0, "aa", then the empty match at 3 follows the previous match and is
  // skipped; the search steps over the two-byte character and finds the empty match at the end.
  EXPECT_EQ(spans, (std::vector<std::pair<size_t, size_t>>{{0, 0}, {1, 3}, {5, 5}}));
}

// ---------------------------------------------------------------------------------------------
TEST(NormalizerTest, UnicodeForms) {
  auto nfc = TokenizerNormalizer::from_json({{"type", "NFC"}}, "test");
  ASSERT_TRUE(nfc.ok());
  EXPECT_EQ(nfc->apply("cafe\xCC\x81"), "caf\xC3\xA9");
  EXPECT_EQ(nfc->apply("\xE2\x84\xAB"), "\xC3\x85");  // ANGSTROM SIGN -> Å
  EXPECT_EQ(nfc->apply(std::string("\0e\xCC\x81", 4)), std::string("\0\xC3\xA9", 3));
  auto sequence = TokenizerNormalizer::from_json(
      {{"type", "Sequence"}, {"normalizers", {{{"type", "NFKC"}}, {{"type", "NFD"}}}}}, "test");
  ASSERT_TRUE(sequence.ok());
  EXPECT_EQ(sequence->apply("\xEF\xAC\x81\xC3\xA9"), "fie\xCC\x81");  // ﬁé -> f i e U+0301
  auto none = TokenizerNormalizer::from_json(nullptr, "test");
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->is_identity());
  auto lowercase = TokenizerNormalizer::from_json({{"type", "Lowercase"}}, "file.json");
  ASSERT_FALSE(lowercase.ok());
  EXPECT_NE(lowercase.status().message().find("Lowercase"), std::string::npos);
}

// ---------------------------------------------------------------------------------------------
TEST(BpeTest, MergesApplyByRankNotByPosition) {
  // "abc": with b+c ranked first the word ends as [a, bc]; with a+b first as [ab, c].
  TempDir first_dir;
  TinyTokenizerSpec bc_first;
  bc_first.merges = {{"b", "c"}, {"a", "b"}};
  auto tokenizer = load_tiny(first_dir, bc_first);
  ASSERT_NE(tokenizer, nullptr);
  EXPECT_EQ(tokenizer->encode("abc"), (std::vector<int32_t>{'a', 256}));
  EXPECT_EQ(tokenizer->encode("ab"), (std::vector<int32_t>{257}));

  TempDir second_dir;
  TinyTokenizerSpec ab_first;
  ab_first.merges = {{"a", "b"}, {"b", "c"}, {"ab", "c"}};
  tokenizer = load_tiny(second_dir, ab_first);
  ASSERT_NE(tokenizer, nullptr);
  EXPECT_EQ(tokenizer->encode("abc"), (std::vector<int32_t>{258}));
  EXPECT_EQ(tokenizer->encode("bcab"), (std::vector<int32_t>{257, 256}));
  EXPECT_EQ(tokenizer->token_id("abc"), 258);
  EXPECT_EQ(tokenizer->token_id("nope"), -1);
}

TEST(BpeTest, EqualRanksMergeLeftmostFirst) {
  TempDir dir;
  TinyTokenizerSpec spec;
  spec.merges = {{"a", "a"}, {"aa", "aa"}};
  auto tokenizer = load_tiny(dir, spec);
  ASSERT_NE(tokenizer, nullptr);
  EXPECT_EQ(tokenizer->encode("aaa"), (std::vector<int32_t>{256, 'a'}));
  EXPECT_EQ(tokenizer->encode("aaaa"), (std::vector<int32_t>{257}));
  EXPECT_EQ(tokenizer->encode("aaaaaaa"), (std::vector<int32_t>{257, 256, 'a'}));
  // Spaces and other bytes become their byte-level characters; Ġ joins only through a merge.
  EXPECT_EQ(tokenizer->encode(" aa\n"), (std::vector<int32_t>{' ', 256, '\n'}));
}

// Naive BPE: repeatedly merge the lowest-ranked adjacent pair, leftmost first.
std::vector<std::string> naive_bpe(
    const std::string& word, const std::map<std::pair<std::string, std::string>, int>& ranks) {
  std::vector<std::string> symbols;
  for (const char c : word) symbols.emplace_back(1, c);
  while (true) {
    int best_rank = -1;
    size_t best = 0;
    for (size_t i = 0; i + 1 < symbols.size(); ++i) {
      const auto it = ranks.find({symbols[i], symbols[i + 1]});
      if (it != ranks.end() && (best_rank < 0 || it->second < best_rank)) {
        best_rank = it->second;
        best = i;
      }
    }
    if (best_rank < 0) return symbols;
    symbols[best] += symbols[best + 1];
    symbols.erase(symbols.begin() + best + 1);
  }
}

TEST(BpeTest, AgreesWithNaiveMergingOnRandomWords) {
  std::mt19937 rng(2024);
  TinyTokenizerSpec spec;
  std::vector<std::string> tokens = {"a", "b", "c", "d"};
  std::map<std::pair<std::string, std::string>, int> ranks;
  std::map<std::string, int32_t> ids = {{"a", 'a'}, {"b", 'b'}, {"c", 'c'}, {"d", 'd'}};
  while (spec.merges.size() < 60) {
    const std::string left = tokens[rng() % tokens.size()];
    const std::string right = tokens[rng() % tokens.size()];
    if (ids.count(left + right) || left.size() + right.size() > 8) continue;  // unique results
    ranks[{left, right}] = static_cast<int>(spec.merges.size());
    ids[left + right] = 256 + static_cast<int32_t>(spec.merges.size());
    spec.merges.emplace_back(left, right);
    tokens.push_back(left + right);
  }
  TempDir dir;
  auto tokenizer = load_tiny(dir, spec);
  ASSERT_NE(tokenizer, nullptr);
  for (int trial = 0; trial < 300; ++trial) {
    const size_t length = trial == 0 ? 2000 : 1 + rng() % 80;  // one long word too
    std::string word(length, 'a');
    for (char& c : word) c = static_cast<char>('a' + rng() % 4);
    std::vector<int32_t> expected;
    for (const std::string& symbol : naive_bpe(word, ranks)) expected.push_back(ids.at(symbol));
    ASSERT_EQ(tokenizer->encode(word), expected) << word;
    ASSERT_EQ(tokenizer->encode(word), expected) << "cached result differs: " << word;
  }
}

TEST(BpeTest, ConcurrentEncodingIsConsistent) {
  TempDir dir;
  TinyTokenizerSpec spec;
  spec.merges = {{"a", "b"}, {"ab", "c"}, {"c", "a"}};
  auto tokenizer = load_tiny(dir, spec);
  ASSERT_NE(tokenizer, nullptr);
  const std::string text = "abc cab abcab ca bc abca";
  const std::vector<int32_t> expected = tokenizer->encode(text);
  std::vector<std::thread> threads;
  std::vector<bool> same(8, false);
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      bool ok = true;
      for (int i = 0; i < 200; ++i) ok = ok && tokenizer->encode(text) == expected;
      same[t] = ok;
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int t = 0; t < 8; ++t) EXPECT_TRUE(same[t]) << t;
}

// ---------------------------------------------------------------------------------------------
TEST(AddedTokensTest, LeftmostLongestAndFlags) {
  AddedTokenMatcher matcher({
      {"<|e", 10, false, false, false, false, true},
      {"<|end|>", 11, false, false, false, false, true},
      {"[L]", 12, false, /*lstrip=*/true, false, false, false},
      {"[R]", 13, false, false, /*rstrip=*/true, false, false},
      {"hi", 14, /*single_word=*/true, false, false, false, false},
  });
  const auto split = [&](const std::string& text) {
    std::vector<std::pair<std::string, int32_t>> out;
    for (const TextPiece& p : matcher.split(text))
      out.emplace_back(text.substr(p.begin, p.end - p.begin), p.id);
    return out;
  };
  using V = std::vector<std::pair<std::string, int32_t>>;
  EXPECT_EQ(split("a<|end|>b<|e"), (V{{"a", -1}, {"<|end|>", 11}, {"b", -1}, {"<|e", 10}}));
  EXPECT_EQ(split("x  [L]y"), (V{{"x", -1}, {"  [L]", 12}, {"y", -1}}));
  EXPECT_EQ(split("x[R] \t y"), (V{{"x", -1}, {"[R] \t ", 13}, {"y", -1}}));
  EXPECT_EQ(split("[R]  [L]"), (V{{"[R]  ", 13}, {"[L]", 12}}));  // the spaces were taken already
  EXPECT_EQ(split("hi there"), (V{{"hi", 14}, {" there", -1}}));
  EXPECT_EQ(split("this chi hi_ hi."), (V{{"this chi hi_ ", -1}, {"hi", 14}, {".", -1}}));
  EXPECT_TRUE(split("").empty());
}

TEST(TokenizerTest, SpecialTokensAreMatchedBeforeSplitting) {
  TempDir dir;
  TinyTokenizerSpec spec;
  spec.merges = {{"a", "b"}, {"\xC4\xA0", "ab"}};  // "Ġ" + "ab"
  spec.added_tokens = {added_token(300, "<|end|>", true),
                       added_token(301, "<|end|>x", false, {{"normalized", false}})};
  auto tokenizer = load_tiny(dir, spec);
  ASSERT_NE(tokenizer, nullptr);
  EXPECT_EQ(tokenizer->encode("ab<|end|> ab"), (std::vector<int32_t>{256, 300, 257}));
  EXPECT_EQ(tokenizer->encode("<|end|><|end|>"), (std::vector<int32_t>{300, 300}));
  EXPECT_EQ(tokenizer->encode("<|end|>xab"), (std::vector<int32_t>{301, 256}));  // longest
  // Not a complete token: ordinary bytes.
  EXPECT_EQ(tokenizer->encode("<|end"), bytes_of("<|end"));
  EXPECT_EQ(tokenizer->token_id("<|end|>"), 300);
}

TEST(TokenizerTest, NormalizedAddedTokensMatchAfterNfc) {
  TempDir dir;
  TinyTokenizerSpec spec;
  // Content given decomposed (e + U+0301); with normalized=true it matches the NFC text "é".
  spec.added_tokens = {added_token(300, "e\xCC\x81", false)};
  auto tokenizer = load_tiny(dir, spec);
  ASSERT_NE(tokenizer, nullptr);
  EXPECT_EQ(tokenizer->encode("caf\xC3\xA9"), (std::vector<int32_t>{'c', 'a', 'f', 300}));
  EXPECT_EQ(tokenizer->encode("cafe\xCC\x81"), (std::vector<int32_t>{'c', 'a', 'f', 300}));
  // A non-normalized special token is found in the raw text, before NFC.
  TempDir raw_dir;
  TinyTokenizerSpec raw;
  raw.added_tokens = {added_token(300, "e\xCC\x81", true)};
  tokenizer = load_tiny(raw_dir, raw);
  ASSERT_NE(tokenizer, nullptr);
  EXPECT_EQ(tokenizer->encode("cafe\xCC\x81"), (std::vector<int32_t>{'c', 'a', 'f', 300}));
  EXPECT_EQ(tokenizer->encode("caf\xC3\xA9"), bytes_of("caf\xC3\xA9"));
}

TEST(TokenizerTest, InvalidUtf8IsReplacedNeverFatal) {
  TempDir dir;
  TinyTokenizerSpec spec;
  spec.added_tokens = {added_token(300, "<|end|>", true)};
  auto tokenizer = load_tiny(dir, spec);
  ASSERT_NE(tokenizer, nullptr);
  const std::vector<int32_t> fffd = bytes_of("\xEF\xBF\xBD");
  std::vector<int32_t> expected = {'a'};
  expected.insert(expected.end(), fffd.begin(), fffd.end());
  expected.push_back(300);
  expected.insert(expected.end(), fffd.begin(), fffd.end());
  EXPECT_EQ(tokenizer->encode("a\xFF<|end|>\xE2\x82"), expected);
  std::mt19937 rng(11);
  for (int trial = 0; trial < 500; ++trial) {
    std::string bytes(rng() % 40, '\0');
    for (char& c : bytes) c = static_cast<char>(rng() % 256);
    EXPECT_EQ(tokenizer->encode(bytes), tokenizer->encode(utf8_replace_invalid(bytes)));
  }
}

TEST(TokenizerTest, LoadErrorsNameTheFileAndField) {
  TempDir missing;
  auto result = Tokenizer::load(missing.path());
  ASSERT_FALSE(result.ok());
  EXPECT_NE(result.status().message().find("tokenizer.json"), std::string::npos);

  const auto load_edited = [](const std::function<void(nlohmann::json&)>& edit) {
    TempDir dir;
    nlohmann::json json =
        tiny_tokenizer_json({{{"a", "b"}}, nlohmann::json::array(), {{"type", "NFC"}}});
    edit(json);
    write_json(dir.path() + "/tokenizer.json", json);
    auto loaded = Tokenizer::load(dir.path());
    return loaded.ok() ? std::string("ok") : std::string(loaded.status().message());
  };
  EXPECT_NE(
      load_edited([](nlohmann::json& j) { j["model"]["type"] = "WordPiece"; }).find("model.type"),
      std::string::npos);
  EXPECT_NE(load_edited([](nlohmann::json& j) {
              j["model"]["merges"].push_back("a zz");
            }).find("merges[1]"),
            std::string::npos);
  EXPECT_NE(load_edited([](nlohmann::json& j) {
              j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(unclosed";
            }).find("pattern"),
            std::string::npos);
  EXPECT_NE(load_edited([](nlohmann::json& j) {
              j["added_tokens"] = nlohmann::json::array({nlohmann::json{{"content", "x"}}});
            }).find("added_tokens[0]"),
            std::string::npos);
  EXPECT_EQ(load_edited([](nlohmann::json& j) {
              j["model"]["merges"] = nlohmann::json::array({nlohmann::json::array({"a", "b"})});
            }),
            "ok");
}

// ---------------------------------------------------------------------------------------------
TEST(TokenizerTest, ChatTemplateIsQwen3WithoutThinking) {
  EXPECT_EQ(qwen3_chat_prompt("a cat"),
            "<|im_start|>user\na cat<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
}

TEST(TokenizerTest, PromptIsTruncatedThenPaddedWithEndOfText) {
  TempDir dir;
  TinyTokenizerSpec spec;
  spec.added_tokens = {added_token(300, "<|endoftext|>", true),
                       added_token(301, "<|im_start|>", true),
                       added_token(302, "<|im_end|>", true)};
  auto tokenizer = load_tiny(dir, spec);
  ASSERT_NE(tokenizer, nullptr);
  const std::vector<int32_t> full = tokenizer->encode(qwen3_chat_prompt("a fox"));
  ASSERT_GT(full.size(), 10u);
  EXPECT_EQ(full.front(), 301);

  const TokenizedPrompt padded =
      tokenize_prompt(*tokenizer, "a fox", static_cast<int64_t>(full.size()) + 5);
  EXPECT_FALSE(padded.truncated);
  EXPECT_EQ(padded.num_tokens, static_cast<int64_t>(full.size()));
  ASSERT_EQ(padded.ids.size(), full.size() + 5);
  EXPECT_TRUE(std::equal(full.begin(), full.end(), padded.ids.begin()));
  for (size_t i = full.size(); i < padded.ids.size(); ++i) EXPECT_EQ(padded.ids[i], 300) << i;

  const TokenizedPrompt exact =
      tokenize_prompt(*tokenizer, "a fox", static_cast<int64_t>(full.size()));
  EXPECT_FALSE(exact.truncated);
  EXPECT_EQ(exact.ids, full);

  const TokenizedPrompt cut = tokenize_prompt(*tokenizer, "a fox", 4);
  EXPECT_TRUE(cut.truncated);
  EXPECT_EQ(cut.num_tokens, 4);
  EXPECT_EQ(cut.ids, std::vector<int32_t>(full.begin(), full.begin() + 4));

  const TokenizedPrompt none = tokenize_prompt(*tokenizer, "a fox", 0);
  EXPECT_TRUE(none.truncated);
  EXPECT_EQ(none.num_tokens, 0);
  EXPECT_TRUE(none.ids.empty());
}

// ---------------------------------------------------------------------------------------------
TEST(TokenizerTest, FromJsonMatchesLoad) {
  TempDir dir;
  TinyTokenizerSpec spec;
  spec.merges = {{"a", "b"}, {"ab", "c"}};
  spec.added_tokens = {added_token(300, "<|x|>", true)};
  const std::unique_ptr<Tokenizer> loaded = load_tiny(dir, spec);
  ASSERT_NE(loaded, nullptr);
  auto parsed = Tokenizer::from_json(tiny_tokenizer_json(spec), nlohmann::json(), "inline");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  for (const char* text : {"abc abd", "x<|x|>abc", "", "caba\n\n b"}) {
    EXPECT_EQ((*parsed)->encode(text), loaded->encode(text)) << text;
  }
  auto bad = Tokenizer::from_json(tiny_tokenizer_json(spec), nlohmann::json::array(), "inline");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("inline"), std::string::npos) << bad.status();
}

// A tokenizer with the Mistral control tokens used by the template as added tokens, at
// 300 + their Tekken id (the tiny vocabulary owns 0..255).
std::unique_ptr<Tokenizer> load_tiny_mistral(const TempDir& dir, bool with_pad) {
  TinyTokenizerSpec spec;
  spec.normalizer = nullptr;  // Tekken's tokenizer.json has none
  spec.added_tokens = {added_token(301, "<s>", true),
                       added_token(303, "[INST]", true),
                       added_token(304, "[/INST]", true),
                       added_token(310, "[IMG]", true),
                       added_token(317, "[SYSTEM_PROMPT]", true),
                       added_token(318, "[/SYSTEM_PROMPT]", true)};
  if (with_pad) spec.added_tokens.push_back(added_token(311, "<pad>", true));
  return load_tiny(dir, spec);
}

TEST(ChatTemplateTest, MistralIsDiffusersFlux2Template) {
  const std::string system =
      "You are an AI that reasons about image descriptions. You give structured responses "
      "focusing on object relationships, object\nattribution and actions without speculation.";
  EXPECT_EQ(kFlux2DevSystemMessage, system);
  EXPECT_EQ(mistral_chat_prompt("a cat"),
            "<s>[SYSTEM_PROMPT]" + system + "[/SYSTEM_PROMPT][INST]a cat[/INST]");
  EXPECT_EQ(mistral_chat_prompt(""),
            "<s>[SYSTEM_PROMPT]" + system + "[/SYSTEM_PROMPT][INST][/INST]");
  EXPECT_EQ(chat_prompt(PromptFormat::kMistralSmall3Chat, "x"), mistral_chat_prompt("x"));
  EXPECT_EQ(chat_prompt(PromptFormat::kQwen3Chat, "x"), qwen3_chat_prompt("x"));
}

TEST(ChatTemplateTest, MistralRemovesEveryImgTokenInOnePass) {
  const auto user = [](const std::string& prompt) {
    const std::string text = mistral_chat_prompt(prompt);
    const size_t begin = text.find("[/SYSTEM_PROMPT][INST]") + 22;
    return text.substr(begin, text.size() - begin - 7);  // without the closing [/INST]
  };
  EXPECT_EQ(user("a [IMG] cat"), "a  cat");
  EXPECT_EQ(user("[IMG][IMG]x[IMG]"), "x");
  EXPECT_EQ(user("[IMG]"), "");
  // Python's str.replace does not rescan what it produced: "[IM" + "G]" stays.
  EXPECT_EQ(user("[IM[IMG]G]"), "[IMG]");
  EXPECT_EQ(user("[img] [IMG_BREAK] [IMG_END]"), "[img] [IMG_BREAK] [IMG_END]");
  // Invalid bytes are replaced before the removal, so the bytes around [IMG] never join into
  // "€" (E2 82 AC).
  EXPECT_EQ(user("\xE2\x82[IMG]\xAC"), "\xEF\xBF\xBD\xEF\xBF\xBD");
}

TEST(ChatTemplateTest, MistralPromptIsTruncatedThenPaddedWithPad) {
  TempDir dir;
  const std::unique_ptr<Tokenizer> tokenizer = load_tiny_mistral(dir, /*with_pad=*/true);
  ASSERT_NE(tokenizer, nullptr);
  const std::vector<int32_t> full = tokenizer->encode(mistral_chat_prompt("a fox"));
  ASSERT_GT(full.size(), 10u);
  EXPECT_EQ(full.front(), 301);  // <s>, once: no special tokens are added
  EXPECT_EQ(full[1], 317);
  EXPECT_EQ(full.back(), 304);
  const auto format = PromptFormat::kMistralSmall3Chat;

  const int64_t length = static_cast<int64_t>(full.size());
  const TokenizedPrompt padded = tokenize_prompt(*tokenizer, format, "a fox", length + 3);
  EXPECT_FALSE(padded.truncated);
  EXPECT_EQ(padded.num_tokens, length);
  std::vector<int32_t> expected = full;
  expected.insert(expected.end(), {311, 311, 311});
  EXPECT_EQ(padded.ids, expected);

  // One token short: the right end goes, and with it [/INST].
  const TokenizedPrompt cut = tokenize_prompt(*tokenizer, format, "a fox", length - 1);
  EXPECT_TRUE(cut.truncated);
  EXPECT_EQ(cut.num_tokens, length - 1);
  EXPECT_EQ(cut.ids, std::vector<int32_t>(full.begin(), full.end() - 1));
  EXPECT_EQ(std::count(cut.ids.begin(), cut.ids.end(), 304), 0);

  // [IMG] in the prompt never reaches the ids.
  const TokenizedPrompt image = tokenize_prompt(*tokenizer, format, "a[IMG] fox", length);
  EXPECT_EQ(image.ids, tokenize_prompt(*tokenizer, format, "a fox", length).ids);
  EXPECT_EQ(std::count(image.ids.begin(), image.ids.end(), 310), 0);

  // An empty prompt still has the whole template: ... [INST] [/INST], then padding.
  // (The tiny vocabulary has no merges, so the system message alone is ~170 ids.)
  const int64_t empty_length = static_cast<int64_t>(full.size()) - 5;  // "a fox" is 5 ids here
  const TokenizedPrompt empty = tokenize_prompt(*tokenizer, format, "", empty_length + 4);
  EXPECT_FALSE(empty.truncated);
  ASSERT_EQ(empty.num_tokens, empty_length);
  EXPECT_EQ(empty.ids[empty.num_tokens - 2], 303);
  EXPECT_EQ(empty.ids[empty.num_tokens - 1], 304);
  EXPECT_EQ(empty.ids.size(), static_cast<size_t>(empty_length + 4));
  for (size_t i = static_cast<size_t>(empty.num_tokens); i < empty.ids.size(); ++i) {
    EXPECT_EQ(empty.ids[i], 311) << i;
  }
  EXPECT_TRUE(tokenize_prompt(*tokenizer, format, "a fox", 0).ids.empty());
}

TEST(ChatTemplateTest, MistralPadsWithTekkenPadIdWhenTheTokenIsMissing) {
  TempDir dir;
  const std::unique_ptr<Tokenizer> tokenizer = load_tiny_mistral(dir, /*with_pad=*/false);
  ASSERT_NE(tokenizer, nullptr);
  EXPECT_EQ(prompt_pad_token(PromptFormat::kMistralSmall3Chat), "<pad>");
  EXPECT_EQ(prompt_pad_fallback_id(PromptFormat::kMistralSmall3Chat), 11);
  const TokenizedPrompt tokens =
      tokenize_prompt(*tokenizer, PromptFormat::kMistralSmall3Chat, "a", 200);
  ASSERT_LT(tokens.num_tokens, 200);
  EXPECT_EQ(tokens.ids.back(), 11);
}

TEST(ChatTemplateTest, QwenFormatIsTheDefaultTokenizePrompt) {
  TempDir dir;
  TinyTokenizerSpec spec;
  spec.added_tokens = {added_token(300, "<|endoftext|>", true),
                       added_token(301, "<|im_start|>", true),
                       added_token(302, "<|im_end|>", true)};
  const std::unique_ptr<Tokenizer> tokenizer = load_tiny(dir, spec);
  ASSERT_NE(tokenizer, nullptr);
  const TokenizedPrompt old_api = tokenize_prompt(*tokenizer, "a [IMG] fox", 80);
  const TokenizedPrompt new_api =
      tokenize_prompt(*tokenizer, PromptFormat::kQwen3Chat, "a [IMG] fox", 80);
  EXPECT_EQ(new_api.ids, old_api.ids);
  EXPECT_EQ(new_api.num_tokens, old_api.num_tokens);
  EXPECT_EQ(new_api.ids.back(), 300);
  EXPECT_EQ(prompt_pad_fallback_id(PromptFormat::kQwen3Chat), 151643);
}

TEST(ChatTemplateTest, FormatNamesAndPipelineClasses) {
  for (const PromptFormat format : {PromptFormat::kQwen3Chat, PromptFormat::kMistralSmall3Chat}) {
    auto parsed = prompt_format_from_name(prompt_format_name(format));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, format);
  }
  EXPECT_FALSE(prompt_format_from_name("llama").ok());
  EXPECT_EQ(*prompt_format_for_pipeline("Flux2Pipeline"), PromptFormat::kMistralSmall3Chat);
  EXPECT_EQ(*prompt_format_for_pipeline("Flux2KleinPipeline"), PromptFormat::kQwen3Chat);
  EXPECT_EQ(*prompt_format_for_pipeline("Flux2KleinKVPipeline"), PromptFormat::kQwen3Chat);
  auto unknown = prompt_format_for_pipeline("FluxPipeline");
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("FluxPipeline"), std::string::npos);
}

}  // namespace
}  // namespace flux2
