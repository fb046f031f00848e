// The "pre_tokenizer" of a tokenizer.json: Split (regex or literal, every delimiter behavior,
// invert), ByteLevel (GPT-2 regex, prefix space, byte-to-unicode mapping) and Sequence of them.
// Tested by tests/host/tokenizer_test.cc (PreTokenizer*) and the corpus in tests/tokenizer/.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "model/tokenizer_regex.h"
#include "nlohmann/json.hpp"

namespace flux2 {

class TokenizerPreTokenizer {
 public:
  // From the "pre_tokenizer" value (null means the whole piece is one word); `source` names the
  // file in errors. Other pre-tokenizer types are rejected with an error naming them.
  static absl::StatusOr<TokenizerPreTokenizer> from_json(const nlohmann::json& pre_tokenizer,
                                                         absl::string_view source);

  // Splits one normalized piece of text (valid UTF-8, not empty) into the words BPE sees, in
  // order; empty words are dropped, as Hugging Face tokenizers does.
  std::vector<std::string> split(absl::string_view piece) const;

 private:
  // How a Split step treats its matches (Hugging Face SplitDelimiterBehavior).
  enum class Behavior {
    kRemoved,             // matches are dropped
    kIsolated,            // every match and every gap is its own word
    kMergedWithPrevious,  // a match joins the word before it
    kMergedWithNext,      // a match joins the word after it
    kContiguous,          // runs of matches (and runs of gaps) form one word
  };
  struct Step {
    // A Split step has a pattern; a ByteLevel step has none.
    std::shared_ptr<const TokenizerRegex> pattern;
    Behavior behavior = Behavior::kIsolated;
    bool invert = false;            // Split: the gaps are the delimiters
    bool add_prefix_space = false;  // ByteLevel: prepend ' ' unless the word starts with one
    bool use_regex = false;         // ByteLevel: split with the GPT-2 pattern first
  };
  static absl::Status append_steps(const nlohmann::json& pre_tokenizer, absl::string_view source,
                                   std::vector<Step>* steps);
  static void split_by_pattern(const TokenizerRegex& pattern, Behavior behavior, bool invert,
                               absl::string_view word, std::vector<std::string>* out);

  std::vector<Step> steps_;
  std::shared_ptr<const TokenizerRegex> gpt2_pattern_;  // for ByteLevel use_regex
};

}  // namespace flux2
