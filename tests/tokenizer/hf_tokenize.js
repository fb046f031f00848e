#!/usr/bin/env node
// The oracle of the tokenizer corpus test: Hugging Face `tokenizers` (Rust, through the node
// binding @anush008/tokenizers that deploy/install_deps.sh installs) behind the same interface as
// `flux2 tokenize`: one JSON string per stdin line -> one JSON array of ids per stdout line, no
// special tokens added. Run by tests/tokenizer/run_corpus_test.sh (ctest tokenizer.corpus_vs_hf):
//   node hf_tokenize.js --tokenizer DIR [--node-modules DIR] [--format qwen3|mistral]
//       < input.jsonl > ids.jsonl
// Stdin is decoded as UTF-8 with U+FFFD for ill-formed bytes (WHATWG, maximal subparts). With
// --format each line is a prompt rendered through that chat template first, written here from
// diffusers (Flux2KleinPipeline's Qwen3 template; Flux2Pipeline's format_input + the
// Mistral-Small-3.1 template), as `flux2 tokenize --format` does.
'use strict';
const fs = require('fs');
const path = require('path');

function die(message) {
  process.stderr.write(`hf_tokenize: ${message}\n`);
  process.exit(1);
}

// diffusers' SYSTEM_MESSAGE of Flux2Pipeline (pipelines/flux2/system_messages.py).
const kFlux2DevSystemMessage = 'You are an AI that reasons about image descriptions. You give ' +
    'structured responses focusing on object relationships, object\nattribution and actions ' +
    'without speculation.';

const kTemplates = {
  qwen3: (prompt) => `<|im_start|>user\n${prompt}<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n`,
  // format_input removes every "[IMG]" (Python's str.replace: one left-to-right pass).
  mistral: (prompt) => `<s>[SYSTEM_PROMPT]${kFlux2DevSystemMessage}[/SYSTEM_PROMPT][INST]` +
      `${prompt.split('[IMG]').join('')}[/INST]`,
};

function parseArgs(argv) {
  const args = { nodeModules: path.resolve(__dirname, '../tools/node_modules') };
  for (let i = 0; i < argv.length; i += 2) {
    if (argv[i] === '--tokenizer') args.tokenizer = argv[i + 1];
    else if (argv[i] === '--node-modules') args.nodeModules = argv[i + 1];
    else if (argv[i] === '--format') {
      if (!(argv[i + 1] in kTemplates)) die(`unknown --format ${argv[i + 1]} (qwen3, mistral)`);
      args.template = kTemplates[argv[i + 1]];
    }
    else die(`unknown argument ${argv[i]}`);
  }
  if (!args.tokenizer) {
    die('usage: hf_tokenize.js --tokenizer DIR [--node-modules DIR] [--format qwen3|mistral]');
  }
  return args;
}

async function main() {
  const args = parseArgs(process.argv.slice(2));
  let binding;
  try {
    binding = require(path.join(args.nodeModules, '@anush008/tokenizers'));
  } catch (error) {
    die(`cannot load @anush008/tokenizers from ${args.nodeModules} (${error.message}); ` +
        'run deploy/install_deps.sh');
  }
  const file = path.join(args.tokenizer, 'tokenizer.json');
  if (!fs.existsSync(file)) die(`${file} is missing; run deploy/install_deps.sh`);
  const tokenizer = binding.Tokenizer.fromFile(file);

  const input = fs.readFileSync(0);
  const lines = [];
  let start = 0;
  for (let i = 0; i <= input.length; ++i) {
    if (i === input.length || input[i] === 0x0a) {
      if (i > start || i < input.length) lines.push(input.subarray(start, i));
      start = i + 1;
    }
  }
  const out = [];
  for (let n = 0; n < lines.length; ++n) {
    let text;
    try {
      text = JSON.parse(lines[n].toString('utf8'));
    } catch (error) {
      die(`stdin line ${n + 1}: ${error.message}`);
    }
    if (typeof text !== 'string') die(`stdin line ${n + 1}: not a JSON string`);
    if (args.template) text = args.template(text);
    const encoding = await tokenizer.encode(text, null, { addSpecialTokens: false });
    out.push(JSON.stringify(encoding.getIds()));
  }
  process.stdout.write(out.map((line) => line + '\n').join(''));
}

main().catch((error) => die(error.stack || String(error)));
