#!/usr/bin/env node
// Writes a copy of a tokenizer directory whose tokenizer.json has the regex of its first Split
// pre-tokenizer replaced (as transformers' fix_mistral_regex does), so that both regex variants
// of Tekken's tokenizer.json can run the corpus (tests/tokenizer/run_corpus_test.sh --split-regex):
//   node replace_split_regex.js IN_DIR OUT_DIR REGEX
// tokenizer_config.json is copied when present; the other files are not needed by the test.
'use strict';
const fs = require('fs');
const path = require('path');

function die(message) {
  process.stderr.write(`replace_split_regex.js: ${message}\n`);
  process.exit(1);
}

const [inDir, outDir, regex] = process.argv.slice(2);
if (!regex) die('usage: replace_split_regex.js IN_DIR OUT_DIR REGEX');
const tokenizer = JSON.parse(fs.readFileSync(path.join(inDir, 'tokenizer.json'), 'utf8'));
const pre = tokenizer.pre_tokenizer;
const steps = pre && pre.type === 'Sequence' ? pre.pretokenizers : [pre];
const split = steps.find((step) => step && step.type === 'Split' && step.pattern && 'Regex' in step.pattern);
if (!split) die(`${inDir}/tokenizer.json has no Split pre-tokenizer with a regex`);
if (split.pattern.Regex === regex) die('the tokenizer already has that regex');
split.pattern.Regex = regex;
fs.mkdirSync(outDir, { recursive: true });
fs.writeFileSync(path.join(outDir, 'tokenizer.json'), JSON.stringify(tokenizer));
const config = path.join(inDir, 'tokenizer_config.json');
if (fs.existsSync(config)) fs.copyFileSync(config, path.join(outDir, 'tokenizer_config.json'));
