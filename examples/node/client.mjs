// Serve a tfcompile bundle (format 2) from Node.js with onnxruntime-node, @huggingface/tokenizers
// and pngjs alone: the same client as examples/python/client.py, command for command, with the same
// JSON output. Everything comes from the bundle's manifest.json.
//
//   node client.mjs BUNDLE generate --prompt "ROMEO:" --prompt "JULIET:" [--max-new-tokens 20]
//   node client.mjs BUNDLE generate --ids 5,6,7 --ids 8      (token ids, for bundles without a tokenizer)
//   node client.mjs BUNDLE logits --prompt "ROMEO:"          (the full graph: the next token's logits)
//   node client.mjs BUNDLE classify "a gorgeous movie" --pair "a premise" "a hypothesis"
//   node client.mjs BUNDLE translate "Ein Hund rennt." [--beam 4]
//   node client.mjs BUNDLE classify-image three.png digits.npy
//
// This example serves fp32 bundles (an fp16 bundle's graphs take and give float16 tensors).

import { createHash } from "node:crypto";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { Tokenizer } from "@huggingface/tokenizers";
import ort from "onnxruntime-node";
import { PNG } from "pngjs";

function fail(message) {
  console.error(`error: ${message}`);
  process.exit(1);
}

// ------------------------------------------------------------------------ the bundle

class Bundle {
  constructor(folder) {
    this.folder = folder;
    this.manifest = JSON.parse(readFileSync(join(folder, "manifest.json"), "utf8"));
    if (this.manifest.format_version !== 2)
      fail(`${folder}: bundle format ${this.manifest.format_version}, this client reads 2`);
    if (this.manifest.precision !== "fp32") fail(`${folder}: this example serves fp32 bundles only`);
    this.context = this.manifest.model.max_seq_len;
    this.sessions = {};
    const info = this.manifest.tokenizer;
    if (info) {
      this.tokenizerJson = JSON.parse(this.read(info.file).toString("utf8"));
      this.tokenizer = new Tokenizer(this.tokenizerJson, {});
      lowercaseSigmaAsRust(this.tokenizer.normalizer);
      // The ids generation and translation may pick: the tokenizer's, added tokens included (the
      // tokenizers library's get_vocab_size()); an embedding table can hold more rows (a Hugging
      // Face T5: 32,128 logits, 32,100 tokens).
      const vocab = this.tokenizerJson.model.vocab;
      const ids = new Set(Array.isArray(vocab) ? vocab.map((_, i) => i) : Object.values(vocab));
      for (const added of this.tokenizerJson.added_tokens ?? []) ids.add(added.id);
      this.emitted = ids.size;
    }
    this.refuseWhatTheRuntimeRefuses();
  }

  // A manifest the runtime refuses at load, which this client would serve otherwise than it was
  // checked (no error, other results): refused here too, at load, in one line.
  refuseWhatTheRuntimeRefuses() {
    const { task, padding, generation, model, translation } = this.manifest;
    const where = this.folder;
    // A decoder's new tokens follow each row's last real token (left); a classifier's and a
    // translator's rows start at position 0 (right): what the graphs were checked with.
    const side = { causal_lm: "left", classification: "right", seq2seq: "right" }[task];
    if (side && padding.side !== side)
      fail(
        `${where}: the manifest's padding.side is "${padding.side}", where a ${task} bundle's rows ` +
          `are padded on the ${side}`,
      );
    if (task === "causal_lm" && generation.context_length !== model.max_seq_len)
      fail(
        `${where}: the manifest's generation.context_length (${generation.context_length}) is not ` +
          `model.max_seq_len (${model.max_seq_len}), the context its graphs were checked at`,
      );
    if (task === "seq2seq" && this.tokenizer) {
      if (!(translation.stop_id < this.emitted))
        fail(
          `${where}: translation.stop_id ${translation.stop_id} is outside the tokenizer's ` +
            `${this.emitted} tokens: no translation could end`,
        );
      if (!this.manifest.tokenizer.special_tokens.unk)
        fail(`${where}: the manifest's tokenizer names no unk token, which an empty source is read as`);
    }
    if (this.tokenizer) this.refuseTruncation();
  }

  // tokenizer.json's truncation must be the manifest's tokenizer.truncation, where it gives one (the
  // runtime cuts as tokenizer.json says, this client as the manifest does), and keep at least one
  // token of a text besides the special tokens it adds: below that (max_length 2 for [CLS] and
  // [SEP]) the tokenizers library fails on every text it cuts, and the limit here would be negative.
  refuseTruncation() {
    const held = libraryTruncation(this.tokenizerJson.truncation);
    const said = this.manifest.tokenizer.truncation;
    const same = (x, y) =>
      x?.max_length === y?.max_length && x?.strategy === y?.strategy && x?.direction === y?.direction;
    const file = join(this.folder, this.manifest.tokenizer.file);
    if (said != null && !same(held, said))
      fail(
        `${file} truncates as ${JSON.stringify(held)}, but the manifest's tokenizer.truncation ` +
          `says ${JSON.stringify(said)}`,
      );
    const added = this.postProcess([], null).tokens.length;
    const stride = this.tokenizerJson.truncation?.stride ?? 0;
    if (held && stride >= held.max_length - added)
      fail(
        `${file}: its truncation's stride ${stride} is not below the ${held.max_length} tokens it ` +
          `keeps less the ${added} special tokens it adds to a text`,
      );
  }

  // A listed file's bytes, refused unless their sha256 is the manifest's.
  read(name) {
    const data = readFileSync(join(this.folder, name));
    if (createHash("sha256").update(data).digest("hex") !== this.manifest.files[name]) {
      fail(`${join(this.folder, name)} changed after export: its sha256 is not the manifest's`);
    }
    return data;
  }

  // The manifest's entry for the graph with this role, and an onnxruntime session on it.
  async graph(role) {
    const found = Object.entries(this.manifest.graphs).find(([, g]) => g.role === role);
    if (!found) fail(`${this.folder} has no ${role} graph: a ${this.manifest.task} bundle`);
    const [name, graph] = found;
    this.sessions[name] ??= await ort.InferenceSession.create(this.read(graph.file), {
      executionProviders: ["cpu"],
    });
    return [graph, this.sessions[name]];
  }

  specialId(role) {
    return this.manifest.tokenizer.special_tokens[role].id;
  }

  // A text, or a [first, second] pair, -> {ids, typeIds}. The tokenizer's post-processor adds the
  // roles in tokenizer.added_by_tokenizer itself ([CLS], [SEP]): the client adds none.
  encode(item, addSpecialTokens = true) {
    const [first, second] = Array.isArray(item) ? item : [item, null];
    let a = this.tokenizer.tokenize(first);
    let b = second === null ? null : this.tokenizer.tokenize(second);
    // The truncation, which this library leaves to its caller, as the runtime cuts each task's texts.
    // A classifier's: the manifest's tokenizer.truncation at no more than the context (without one,
    // longest-first from the right at the context). A decoder's prompt and a translator's source:
    // the tokenizer's own (the manifest's, or tokenizer.json's where the manifest gives none, the
    // field missing or null), not the context: generation reads a prompt's last context_length
    // tokens, and translate() cuts a source to the context.
    const info = this.manifest.tokenizer.truncation;
    const truncation =
      this.manifest.task === "classification"
        ? {
            ...(info ?? { strategy: "longest_first", direction: "right" }),
            max_length: Math.min(info?.max_length ?? this.context, this.context),
          }
        : info == null // absent or null: the runtime cuts as tokenizer.json says
          ? libraryTruncation(this.tokenizerJson.truncation)
          : info;
    if (truncation) {
      const added = addSpecialTokens ? this.postProcess([], b && []).tokens.length : 0;
      [a, b] = truncate(truncation, a, b, added);
    }
    const { tokens, token_type_ids } = addSpecialTokens
      ? this.postProcess(a, b)
      : { tokens: [...a, ...(b ?? [])] };
    const unknown = this.manifest.tokenizer.unknown;
    const ids = tokens.map(
      (t) => this.tokenizer.token_to_id(t) ?? (unknown === "map" ? this.specialId("unk") : undefined),
    );
    if (ids.includes(undefined))
      fail(`the text holds characters outside the vocabulary: ${JSON.stringify(item)}`);
    return { ids, typeIds: token_type_ids ?? ids.map(() => 0) };
  }

  postProcess(a, b) {
    return this.tokenizer.post_processor
      ? this.tokenizer.post_processor(a, b, true)
      : { tokens: [...a, ...(b ?? [])] };
  }

  decode(ids) {
    return ids.length
      ? this.tokenizer.decode(ids, { skip_special_tokens: true, clean_up_tokenization_spaces: false })
      : "";
  }
}

// The Rust `tokenizers` library, the runtime's, lowercases (BertNormalizer with lowercase, and
// Lowercase, in a Sequence too) one character at a time: Σ is σ everywhere. This library lowercases
// with JavaScript's toLowerCase(), whose one mapping that reads the context, Unicode's Final_Sigma,
// makes a Σ that ends a word ς, another token. So each lowercasing normaliser gets its capital
// sigmas as σ first (after the normalisers before it: NFKC makes Σ of 𝚺 or Ϲ).
function lowercaseSigmaAsRust(normalizer) {
  if (!normalizer) return;
  for (const inner of normalizer.normalizers ?? []) lowercaseSigmaAsRust(inner);
  const { type, lowercase } = normalizer.config;
  if (type === "Lowercase" || (type === "BertNormalizer" && lowercase)) {
    const normalize = normalizer.normalize.bind(normalizer);
    normalizer.normalize = (text) => normalize(text.replaceAll("Σ", "σ"));
  }
}

// tokenizer.json's truncation ({max_length, strategy: "LongestFirst", direction: "Right", ...}) in
// the manifest's terms, or null.
function libraryTruncation(cut) {
  if (!cut) return null;
  const snake = (name) => name.replace(/([a-z])([A-Z])/g, "$1_$2").toLowerCase();
  // A field tokenizer.json leaves out is the Rust library's default: LongestFirst, Right, 512.
  return {
    max_length: cut.max_length ?? 512,
    strategy: snake(cut.strategy ?? "LongestFirst"),
    direction: snake(cut.direction ?? "Right"),
  };
}

// The `tokenizers` library's truncation: a pair over the limit keeps the shorter sequence whole if
// it fits in half, else each keeps half (the longer one the odd token). only_first and only_second
// cut that sequence alone; where it cannot make the room (no second sequence, or one no longer than
// the excess), where the library fails, tfcompile's runtime cuts longest-first, and so does this
// client. A sequence keeps its first tokens (direction right) or its last (left).
function truncate({ max_length, strategy, direction }, a, b, added) {
  const keep = (tokens, n) => (direction === "left" ? tokens.slice(tokens.length - n) : tokens.slice(0, n));
  const limit = max_length - added;
  const excess = a.length + (b?.length ?? 0) - limit;
  if (excess <= 0) return [a, b];
  if (strategy === "only_first" && a.length > excess) return [keep(a, a.length - excess), b];
  if (strategy === "only_second" && b !== null && b.length > excess) return [a, keep(b, b.length - excess)];
  if (b === null) return [keep(a, limit), null];
  const short = Math.min(a.length, b.length);
  const [keepShort, keepLong] =
    short <= limit - short ? [short, limit - short] : [Math.floor(limit / 2), Math.ceil(limit / 2)];
  return a.length <= b.length
    ? [keep(a, keepShort), keep(b, keepLong)]
    : [keep(a, keepLong), keep(b, keepShort)];
}

// ------------------------------------------------------------------------ tensors

// Rows of ids -> rows of the longest's length, filled out with `value` on `side`.
function pad(rows, value, side) {
  const width = Math.max(...rows.map((r) => r.length));
  return rows.map((r) => {
    const fill = Array(width - r.length).fill(value);
    return side === "left" ? [...fill, ...r] : [...r, ...fill];
  });
}

const ones = (rows) => rows.map((r) => r.map(() => 1));

// padding.pad_id and padding.side: the attention mask hides padding, whatever its id.
function padding(bundle) {
  const info = bundle.manifest.padding;
  return [info.pad_id, info.side];
}

// Rows of ids (all of one length) -> an int64 tensor (rows, length).
function int64(rows) {
  return new ort.Tensor("int64", BigInt64Array.from(rows.flat(), BigInt), [rows.length, rows[0].length]);
}

// Every `past` input with its cache axis at 0 (shape and names from the manifest).
function emptyCache(graph, batch) {
  const { past, axis } = graph.cache;
  const cache = {};
  for (const input of graph.inputs.filter((t) => past.includes(t.name))) {
    const shape = input.shape.map((d) => (d === "batch" ? batch : d === axis ? 0 : d));
    cache[input.name] = new ort.Tensor("float32", new Float32Array(0), shape);
  }
  return cache;
}

// A float tensor's rows `rows` (along axis 0), in that order.
function takeRows(tensor, rows) {
  const size = tensor.data.length / tensor.dims[0];
  const data = new tensor.data.constructor(rows.length * size);
  rows.forEach((r, i) => data.set(tensor.data.subarray(r * size, (r + 1) * size), i * size));
  return new ort.Tensor(tensor.type, data, [rows.length, ...tensor.dims.slice(1)]);
}

// logits (batch, sequence, vocab) -> each row's last position, as arrays.
function lastLogits(logits) {
  const [batch, sequence, vocab] = logits.dims;
  return Array.from({ length: batch }, (_, r) =>
    Array.from(logits.data.subarray(((r + 1) * sequence - 1) * vocab, (r + 1) * sequence * vocab)),
  );
}

const argmax = (xs) => xs.reduce((best, x, i) => (x > xs[best] ? i : best), 0);

function logSoftmax(xs) {
  const max = Math.max(...xs);
  const shifted = xs.map((x) => x - max);
  const log = Math.log(shifted.reduce((s, x) => s + Math.exp(x), 0));
  return shifted.map((x) => x - log);
}

// (batch, labels) logits -> each row's likeliest label and every label's probability.
function probabilities(logits, labels) {
  // A manifest of other labels than the graph's logits would name the wrong classes: refused.
  if (logits.dims.at(-1) !== labels.length)
    fail(`the manifest names ${labels.length} labels, but the graph gives ${logits.dims.at(-1)} logits a row`);
  const rows = [];
  for (let r = 0; r < logits.dims[0]; r++) {
    const xs = Array.from(logits.data.subarray(r * labels.length, (r + 1) * labels.length));
    const max = Math.max(...xs);
    const exps = xs.map((x) => Math.exp(x - max));
    const total = exps.reduce((s, x) => s + x, 0);
    const probs = exps.map((x) => x / total);
    rows.push({
      label: labels[argmax(probs)],
      probabilities: Object.fromEntries(labels.map((l, i) => [l, probs[i]])),
    });
  }
  return rows;
}

// ------------------------------------------------------------------------ decoders (causal_lm)

// --prompt texts, encoded, or --ids rows of token ids: each an integer in [0, model.vocab_size), as
// the runtime takes them (an empty item, "-1" or "1.5" is refused, not read as a number).
function promptIds(bundle, prompts, ids) {
  if (prompts.length && ids.length) fail("give --prompt or --ids, not both");
  const vocab = bundle.manifest.model.vocab_size ?? 0; // none: no id, as the runtime reads it
  const tokenIds = (row, i) =>
    row.split(",").map((item, j) => {
      const id = /^[0-9]+$/.test(item.trim()) ? Number(item.trim()) : NaN;
      if (!(id < vocab))
        fail(`--ids row ${i}, item ${j}: ${JSON.stringify(item)} is not a token id in [0, ${vocab})`);
      return id;
    });
  const rows = ids.length
    ? ids.map((row, i) => tokenIds(row ?? "", i))
    : prompts.map((p) => bundle.encode(p).ids);
  if (!rows.length || rows.some((r) => !r.length))
    fail("give at least one prompt, each of at least one token");
  return rows;
}

// Greedy generation with the KV cache for a batch of prompts of different lengths, left-padded
// (tokenizer.padding_side): attention_mask, 0 at padding, covers the cached and the new tokens at
// every step, and positions come from it, so each row generates what it would alone. A row ends at
// its first stop token (returned as its last). Past the context, each step re-reads the last
// context_length tokens from an empty cache. The logits of the tokens a row holds (real ones) are
// penalised first, as the manifest's repetition_penalty says (1 by default: not), in float32; then
// its bans are set to -Infinity: the stop tokens while the row has fewer than min_new_tokens new ones
// or min_length in all, and what banTokens bans over the row's real tokens. A row whose every token
// is banned ends there.
async function generate(bundle, prompts, maxNewTokens) {
  const [graph, session] = await bundle.graph("decode_step");
  const g = bundle.manifest.generation;
  const { context_length: context, stop_token_ids: stops } = g;
  const penalty = Math.fround(g.repetition_penalty ?? 1);
  const [padId, side] = padding(bundle);
  const ids = pad(prompts, padId, side); // every row's tokens so far
  const mask = pad(ones(prompts), 0, side);
  const newIds = prompts.map(() => []);
  const done = prompts.map(() => false);
  let past = emptyCache(graph, prompts.length);
  let tokens = ids.map((row) => row.slice(-context)); // the window the next run reads
  let cached = 0; // tokens in the cache
  for (let step = 0; step < maxNewTokens; step++) {
    cached += tokens[0].length;
    const out = await session.run({
      input_ids: int64(tokens),
      attention_mask: int64(mask.map((m) => m.slice(-cached))),
      ...past,
    });
    const next = lastLogits(out.logits).map((xs, row) => {
      const scores = xs.slice(0, bundle.emitted);
      const seen = penalty === 1 ? [] : new Set(ids[row].filter((_, i) => mask[row][i] === 1));
      for (const token of seen) {
        const score = scores[token];
        if (token < scores.length) scores[token] = Math.fround(score < 0 ? score * penalty : score / penalty);
      }
      const real = ids[row].filter((_, i) => mask[row][i] === 1);
      if (newIds[row].length < (g.min_new_tokens ?? 0) || real.length < (g.min_length ?? 0)) {
        for (const stop of stops) if (stop < scores.length) scores[stop] = -Infinity;
      }
      banTokens(scores, real, g);
      if (scores.every((x) => x === -Infinity)) done[row] = true;
      return argmax(scores);
    });
    next.forEach((token, row) => {
      if (!done[row]) {
        newIds[row].push(token);
        done[row] = stops.includes(token);
      }
    });
    if (done.every(Boolean)) break;
    next.forEach((token, row) => {
      ids[row].push(token);
      mask[row].push(1);
    });
    past = Object.fromEntries(graph.cache.past.map((name, i) => [name, out[graph.cache.present[i]]]));
    tokens = next.map((t) => [t]);
    if (cached === context) {
      // the window is full: slide it, from an empty cache
      [past, tokens, cached] = [emptyCache(graph, prompts.length), ids.map((row) => row.slice(-context)), 0];
    }
  }
  return newIds;
}

// The full graph over left-padded prompts: the logits that follow each prompt's last token.
async function logitsOf(bundle, prompts) {
  const [, session] = await bundle.graph("forward");
  const [padId, side] = padding(bundle);
  const ids = pad(prompts, padId, side);
  const mask = pad(ones(prompts), 0, side);
  const out = await session.run({ input_ids: int64(ids), attention_mask: int64(mask) });
  return lastLogits(out.logits);
}

// ------------------------------------------------------------------------ text classifiers

// Sentences or [first, second] pairs -> probabilities per label. Right-padded; the graph takes the
// inputs the manifest lists (input_ids, attention_mask, token_type_ids).
async function classify(bundle, items) {
  const [graph, session] = await bundle.graph("forward");
  const [padId, side] = padding(bundle);
  const encodings = items.map((item) => bundle.encode(item));
  const ids = encodings.map((e) => e.ids);
  const feed = {
    input_ids: int64(pad(ids, padId, side)),
    attention_mask: int64(pad(ones(ids), 0, side)),
    token_type_ids: int64(
      pad(
        encodings.map((e) => e.typeIds),
        0,
        side,
      ),
    ),
  };
  const out = await session.run(Object.fromEntries(graph.inputs.map((t) => [t.name, feed[t.name]])));
  return probabilities(out.logits, bundle.manifest.labels);
}

// ------------------------------------------------------------------------ translators (seq2seq)

// The encoder graph once over the sources, then the decoder step graph one target token at a time,
// with the self-attention cache and the encoder's memory_* outputs fed back by name.
class TranslationDecoder {
  static async create(bundle, sourceIds, sourceMask) {
    const self = new TranslationDecoder();
    const [, encoder] = await bundle.graph("encoder");
    self.memory = await encoder.run({ source_ids: sourceIds, source_mask: sourceMask });
    [self.graph, self.session] = await bundle.graph("decoder_step");
    self.sourceMask = sourceMask;
    self.past = emptyCache(self.graph, sourceIds.dims[0]);
    self.emitted = bundle.emitted;
    return self;
  }

  // tokens (rows of one id) -> each row's logits of the token after them, the tokenizer's ids only.
  async step(tokens) {
    const out = await this.session.run({
      input_ids: int64(tokens),
      source_mask: this.sourceMask,
      ...this.past,
      ...this.memory,
    });
    const { past, present } = this.graph.cache;
    this.past = Object.fromEntries(past.map((name, i) => [name, out[present[i]]]));
    return lastLogits(out.logits).map((xs) => xs.slice(0, this.emitted));
  }

  // Row i of the cache, the memory and the source mask becomes the old row rows[i].
  keep(rows) {
    for (const part of [this.past, this.memory])
      for (const name in part) part[name] = takeRows(part[name], rows);
    this.sourceMask = takeRows(this.sourceMask, rows);
  }
}

// Sentences -> target ids, without the start and stop tokens. Greedy (beam 1) decodes the batch at
// once (right-padded sources); beam search decodes one sentence at a time.
async function translate(bundle, texts, beam) {
  const t = bundle.manifest.translation;
  beam ??= t.beam;
  // The decoder reads the start token, then the tokens it is given (NLLB's target language code),
  // before it chooses any; max_decode_len counts them all after the start, which takes a position too.
  // With forced_eos the last of those places is the stop token's: a translation cut there is a token shorter.
  const start = [t.start_id, ...(t.target_prefix_ids ?? [])];
  const limit = Math.min(t.max_decode_len, bundle.context - 1) - (start.length - 1);
  // Sources are cut to leave room for the prefix (BART's <s>) and the suffix (T5's </s>); an empty
  // one reads as [UNK].
  const prefix = t.source_prefix_ids ?? [];
  const suffix = t.source_suffix_ids ?? [];
  const sources = texts
    .map((text) => bundle.encode(text, false).ids.slice(0, bundle.context - prefix.length - suffix.length))
    .map((s) => [...prefix, ...(s.length ? s : [bundle.specialId("unk")]), ...suffix]);
  if (beam > 1) {
    // one sentence at a time, unpadded
    const results = [];
    for (const s of sources) {
      const decoder = await TranslationDecoder.create(bundle, int64([s]), int64(ones([s])));
      const search = t.beam_scoring === "transformers" ? transformersBeamSearch : beamSearch;
      results.push(await search(decoder, start, t, limit, beam));
    }
    return results;
  }
  const [padId, side] = padding(bundle);
  const ids = int64(pad(sources, padId, side));
  const mask = int64(pad(ones(sources), 0, side));
  const decoder = await TranslationDecoder.create(bundle, ids, mask);
  const newIds = sources.map(() => []);
  const done = sources.map(() => false);
  let tokens = sources.map(() => [...start]);
  const chosen = t.forced_eos ? limit - 1 : limit;
  for (let step = 0; step < chosen && !done.every(Boolean); step++) {
    const logits = await decoder.step(tokens);
    tokens = logits.map((scores, row) => {
      const banned = ban(t, scores, [...start, ...newIds[row]]);
      if (banned.every((x) => x === -Infinity)) done[row] = true; // every token banned: the row ends
      return [argmax(banned)];
    });
    tokens.forEach(([token], row) => {
      done[row] ||= token === t.stop_id;
      if (!done[row]) newIds[row].push(token);
    });
  }
  return newIds;
}

// A row's scores (its next token's), with -Infinity at each token it may not be after its tokens
// `sequence` (the start on): the stop token while fewer than min_decode_len tokens follow the start,
// and what banTokens bans.
function ban(t, scores, sequence) {
  const out = Array.from(scores);
  if (sequence.length - 1 < (t.min_decode_len ?? 0)) out[t.stop_id] = -Infinity;
  banTokens(out, sequence, t);
  return out;
}

// In place, the scores of the token after `sequence`, as the manifest's section `bans` (generation or
// translation) says: -Infinity at each of its suppressed_ids, at each token that would end an n-gram
// of no_repeat_ngram_size tokens found earlier in the sequence (0: none), and at the last token of
// each of its banned_sequences whose others end the sequence.
function banTokens(scores, sequence, bans) {
  const n = bans.no_repeat_ngram_size ?? 0;
  for (const id of bans.suppressed_ids ?? []) if (id < scores.length) scores[id] = -Infinity;
  for (const word of bans.banned_sequences ?? []) {
    const head = word.slice(0, -1);
    const tail = sequence.slice(sequence.length - head.length);
    if (word.at(-1) < scores.length && head.length <= sequence.length && head.every((t, j) => t === tail[j])) {
      scores[word.at(-1)] = -Infinity;
    }
  }
  const last = sequence.slice(sequence.length - n + 1);
  for (let i = 0; n && i + n <= sequence.length; i++) {
    const next = sequence[i + n - 1];
    if (sequence.slice(i, i + n - 1).every((token, j) => token === last[j]) && next < scores.length) {
      scores[next] = -Infinity;
    }
  }
}

// One sentence, after the tokens `start` (not scored): keep the `beam` best hypotheses by summed
// log-probability; the stop token ends a hypothesis only from within the top `beam` candidates; a
// finished hypothesis scores log p / ((5 + length) / 6) ** length_penalty. Ends when `beam` have
// finished or at the limit (with forced_eos, a step before it: every hypothesis then ends with the
// stop token, scored). What `ban` bans scores -Infinity (the other tokens keep their log-probabilities)
// and is never taken: a hypothesis whose every token is banned finishes as it is.
async function beamSearch(decoder, start, t, limit, beam) {
  const score = (logP, length) => logP / ((5 + length) / 6) ** t.length_penalty;
  let hypotheses = [{ total: 0, words: [] }];
  const finished = [];
  let logProbs = (await decoder.step([start])).map(logSoftmax);
  for (let step = 0; step <= limit; step++) {
    if (t.forced_eos && step === limit - 1) {
      // the last place is the stop token's
      finished.push(
        ...hypotheses.map((h, row) => ({ score: score(h.total + logProbs[row][t.stop_id], h.words.length), words: h.words })),
      );
      break;
    }
    const banned = hypotheses.map((h, parent) => ban(t, logProbs[parent], [...start, ...h.words]));
    const ended = banned.map((scores) => scores.every((x) => x === -Infinity));
    hypotheses.forEach((h, i) => {
      if (ended[i]) finished.push({ score: score(h.total, h.words.length), words: h.words });
    });
    const candidates = hypotheses.flatMap((h, parent) =>
      banned[parent].map((lp, token) => ({ total: h.total + lp, parent, token })),
    );
    candidates.sort((x, y) => y.total - x.total); // stable: ties keep the lower index first
    const survivors = [];
    const taken = candidates.slice(0, 2 * beam).filter((c) => c.total > -Infinity); // banned: never
    taken.forEach(({ total, parent, token }, rank) => {
      const words = hypotheses[parent].words;
      if (token === t.stop_id) {
        if (rank < beam) finished.push({ score: score(total, words.length), words });
      } else if (survivors.length < beam) {
        survivors.push({ total, words: [...words, token], parent });
      }
    });
    if (finished.length >= beam) break;
    if (step === limit) {
      // out of length: the current hypotheses end here, unfinished
      const going = hypotheses.filter((_, i) => !ended[i]);
      finished.push(...going.map((h) => ({ score: score(h.total, h.words.length), words: h.words })));
      break;
    }
    if (!survivors.length) break;
    decoder.keep(survivors.map((s) => s.parent));
    hypotheses = survivors;
    logProbs = (await decoder.step(hypotheses.map((h) => [h.words.at(-1)]))).map(logSoftmax);
  }
  return finished.reduce((best, f) => (f.score > best.score ? f : best)).words;
}

// transformers' generate() beam search (beam_scoring "transformers"): `beam` hypotheses, the first
// scoring 0 and the others -1e9; each step the 2 x `beam` best candidates, of which those among the
// first `beam` that end (the stop token, or the last place) finish, scored
// log p / length ** length_penalty (length: the tokens after the start token, the prefix's and the
// stop token included), the best `beam` kept; the next hypotheses are the `beam` best candidates, an
// ending one lowered by 1e9. With forced_eos the last place is the stop token's, at log-probability 0.
// It ends at the last place, or as early_stopping says.
async function transformersBeamSearch(decoder, start, t, limit, beam) {
  const penalty = t.length_penalty;
  const early = t.early_stopping ?? false;
  const given = start.length - 1;
  let hypotheses = Array.from({ length: beam }, (_, i) => ({ total: i ? -1e9 : 0, words: [] }));
  let rows = hypotheses.map(() => 0); // each hypothesis's row of the decoder's cache
  let finished = []; // best first
  let logits = await decoder.step([start]);
  for (let step = 0; step < limit; step++) {
    const last = step === limit - 1;
    const candidates = hypotheses.flatMap((h, parent) => {
      let scores = ban(t, logSoftmax(Array.from(logits[rows[parent]])), [...start, ...h.words]);
      if (t.forced_eos && last) scores = scores.map((_, token) => (token === t.stop_id ? 0 : -Infinity));
      return scores.map((lp, token) => ({ total: h.total + lp, parent, token }));
    });
    candidates.sort((x, y) => y.total - x.total); // stable: ties keep the lower index first
    const top = candidates.slice(0, 2 * beam);
    const length = given + step + 1;
    for (const { total, parent, token } of top.slice(0, beam)) {
      if ((token === t.stop_id || last) && total > -Infinity) {
        const words = [...hypotheses[parent].words, ...(token === t.stop_id ? [] : [token])];
        finished.push({ score: total / length ** penalty, words });
      }
    }
    finished = finished.sort((x, y) => y.score - x.score).slice(0, beam);
    if (last) break;
    const lowered = (c) => (c.token === t.stop_id ? c.total - 1e9 : c.total);
    const live = [...top].sort((x, y) => lowered(y) - lowered(x)).slice(0, beam);
    const full = finished.length === beam;
    const next = live.map((c) => ({ total: lowered(c), words: [...hypotheses[c.parent].words, c.token] }));
    if (early === true && full) break;
    const longest = early === "never" && penalty > 0 ? given + limit : length;
    if (!(next[0].total / longest ** penalty > (full ? finished.at(-1).score : -1e9))) break;
    decoder.keep(live.map((c) => rows[c.parent]));
    rows = live.map((_, i) => i);
    hypotheses = next;
    logits = await decoder.step(live.map((c) => [c.token]));
  }
  return finished.length ? finished[0].words : [];
}

// ------------------------------------------------------------------------ image classifiers

// A PNG file (via pngjs, as RGBA) or a .npy array -> {height, width, channels, data, uint8}.
function readImage(path, image) {
  if (path.endsWith(".npy")) return readNpy(path, image.channels);
  const bytes = readFileSync(path);
  let png = PNG.sync.read(bytes);
  // pngjs rescales 16-bit samples to round(v / 257); the manifest takes their high byte, v >> 8
  if (png.depth === 16) png = PNG.sync.read(bytes, { skipRescale: true });
  keepKeyColour(png);
  const d = png.depth === 16 ? Uint8Array.from(png.data, (v) => v >> 8) : png.data;
  const pixels = png.width * png.height;
  if (image.channel_order === "RGB") {
    const data = new Uint8Array(pixels * 3);
    for (let i = 0; i < pixels; i++) data.set(d.subarray(4 * i, 4 * i + 3), 3 * i);
    return { height: png.height, width: png.width, data, uint8: true };
  }
  // "L": Pillow's convert("L"), ITU-R 601-2 luma in 16-bit fixed point, rounded
  const data = new Uint8Array(pixels);
  for (let i = 0; i < pixels; i++)
    data[i] = (d[4 * i] * 19595 + d[4 * i + 1] * 38470 + d[4 * i + 2] * 7471 + 0x8000) >> 16;
  return { height: png.height, width: png.width, data, uint8: true };
}

// A grey or RGB PNG with a tRNS colour key: pngjs zeroes the pixels of that colour (RGBA 0, 0, 0, 0),
// where Pillow, as the runtime reads PNGs, keeps their colour and drops the transparency. Such a
// PNG has no alpha channel, so alpha 0 marks exactly those pixels: they get the key colour back, at
// the samples' bit depth (16-bit: as read, with skipRescale; 1, 2, 4: scaled to 0-255 as pngjs
// scales every other sample).
function keepKeyColour(png) {
  const key = png.transColor;
  if (!key || png.palette) return; // a palette's tRNS is per entry, and pngjs keeps its colours
  const scale = png.depth < 8 ? (v) => Math.floor((v * 255) / (2 ** png.depth - 1) + 0.5) : (v) => v;
  const [r, g, b] = (key.length === 1 ? [key[0], key[0], key[0]] : key).map(scale);
  const d = png.data;
  for (let i = 0; i < d.length; i += 4) if (d[i + 3] === 0) [d[i], d[i + 1], d[i + 2]] = [r, g, b];
}

// A .npy file of shape (H, W, channels), or (H, W) for a 1-channel model: uint8 0-255 ('|u1') or
// floats in [0, 1] ('<f4', '<f8'). As the runtime, anything else is refused, not read as something
// else: other channels or dimensions (an RGBA array for an RGB model), other types, floats outside
// [0, 1] (NaN included).
function readNpy(path, channels) {
  const bytes = readFileSync(path);
  const headerLength = bytes[6] === 1 ? bytes.readUInt16LE(8) : bytes.readUInt32LE(8);
  const start = bytes[6] === 1 ? 10 : 12;
  const header = bytes.toString("latin1", start, start + headerLength);
  const descr = header.match(/'descr':\s*'([^']+)'/)[1];
  const shape = header
    .match(/'shape':\s*\(([^)]*)\)/)[1]
    .split(",")
    .filter((s) => s.trim())
    .map(Number);
  if (/'fortran_order':\s*True/.test(header)) fail(`${path}: Fortran-ordered arrays are not supported`);
  const Type = { "|u1": Uint8Array, "<f4": Float32Array, "<f8": Float64Array }[descr];
  if (!Type) fail(`${path}: image arrays must be uint8 (0-255) or float (0-1), got dtype ${descr}`);
  const shown = `(${shape.join(", ")}${shape.length === 1 ? "," : ""})`;
  const fits = (shape.length === 3 && shape[2] === channels) || (shape.length === 2 && channels === 1);
  if (!fits || shape.includes(0)) {
    const grey = channels === 1 ? " or (height, width)" : "";
    fail(`${path}: an image array must have shape (height, width, ${channels})${grey}, got ${shown}`);
  }
  const body = bytes.subarray(start + headerLength);
  const data = new Type(body.buffer.slice(body.byteOffset, body.byteOffset + body.length));
  if (descr !== "|u1") {
    let [min, max] = [Infinity, -Infinity];
    for (const x of data) [min, max] = [Math.min(min, x), Math.max(max, x)]; // NaN makes both NaN
    if (!(min >= 0 && max <= 1))
      fail(`${path}: a float image array must hold values in [0, 1], found [${min}, ${max}]`);
  }
  return { height: shape[0], width: shape[1], data, uint8: descr === "|u1" };
}

// Pillow's resampling (Resample.c) with its bilinear filter, for one float32 plane: a triangle
// filter whose support widens with the downscaling factor, the horizontal pass first, each pass
// summed in double precision and stored as float32.
function resize(plane, inW, inH, outW, outH) {
  const taps = (inSize, outSize) => {
    const scale = inSize / outSize;
    const filterScale = Math.max(scale, 1);
    const support = 1.0 * filterScale;
    const invScale = 1.0 / filterScale;
    return Array.from({ length: outSize }, (_, o) => {
      const center = (o + 0.5) * scale;
      const min = Math.max(Math.trunc(center - support + 0.5), 0);
      const max = Math.min(Math.trunc(center + support + 0.5), inSize);
      const weights = [];
      for (let x = min; x < max; x++) weights.push(Math.max(0, 1 - Math.abs((x - center + 0.5) * invScale)));
      const total = weights.reduce((s, w) => s + w, 0);
      return { min, weights: total === 0 ? weights : weights.map((w) => w / total) };
    });
  };
  const horizontal = taps(inW, outW);
  const vertical = taps(inH, outH);
  const across = new Float32Array(outW * inH);
  for (let y = 0; y < inH; y++) {
    horizontal.forEach(({ min, weights }, x) => {
      let sum = 0.0;
      weights.forEach((w, k) => (sum += plane[y * inW + min + k] * w));
      across[y * outW + x] = sum;
    });
  }
  const out = new Float32Array(outW * outH);
  vertical.forEach(({ min, weights }, y) => {
    for (let x = 0; x < outW; x++) {
      let sum = 0.0;
      weights.forEach((w, k) => (sum += across[(min + k) * outW + x] * w));
      out[y * outW + x] = sum;
    }
  });
  return out;
}

// Python's round(): halves go to the even neighbour.
const roundHalfEven = (x) => (Math.abs(x % 1) === 0.5 ? 2 * Math.round(x / 2) : Math.round(x));

// An image -> (channels, size, size) float32, as the manifest's image section says: decode to
// channel_order; uint8 / divide_by (floats are taken as already in [0, 1]); resize (Pillow's bilinear,
// per channel, in float32) the shorter side to size (the longer side rounded half to even), or with
// resize "stretch" both sides, unless the image is already size x size; crop the centre; normalise
// each channel; lay out as NCHW.
function preprocess(image, { height: H, width: W, data, uint8 }) {
  const { size, channels, divide_by: divideBy, mean, std } = image;
  let planes = Array.from({ length: channels }, (_, c) => {
    const plane = new Float32Array(H * W);
    for (let i = 0; i < H * W; i++)
      plane[i] = uint8 ? Math.fround(data[i * channels + c] / divideBy) : data[i * channels + c];
    return plane;
  });
  let [h, w] = [H, W];
  if (H !== size || W !== size) {
    const factor = size / Math.min(H, W);
    [h, w] =
      image.resize === "stretch" // as transformers' ViTImageProcessor
        ? [size, size]
        : [Math.max(size, roundHalfEven(H * factor)), Math.max(size, roundHalfEven(W * factor))];
    planes = planes.map((p) => resize(p, W, H, w, h));
  }
  const [top, left] = [Math.floor((h - size) / 2), Math.floor((w - size) / 2)];
  const out = new Float32Array(channels * size * size);
  planes.forEach((p, c) => {
    const [m, s] = [Math.fround(mean[c]), Math.fround(std[c])];
    for (let y = 0; y < size; y++)
      for (let x = 0; x < size; x++)
        out[(c * size + y) * size + x] = Math.fround(p[(top + y) * w + left + x] - m) / s;
  });
  return out;
}

async function classifyImages(bundle, paths) {
  const [, session] = await bundle.graph("forward");
  const { size, channels } = bundle.manifest.image;
  const pixels = new Float32Array(paths.length * channels * size * size);
  paths.forEach((path, i) =>
    pixels.set(
      preprocess(bundle.manifest.image, readImage(path, bundle.manifest.image)),
      i * channels * size * size,
    ),
  );
  const out = await session.run({
    pixel_values: new ort.Tensor("float32", pixels, [paths.length, channels, size, size]),
  });
  return probabilities(out.logits, bundle.manifest.labels);
}

// ------------------------------------------------------------------------ command line

const USAGE = "usage: node client.mjs BUNDLE {generate,logits,classify,translate,classify-image} ...";

// Each command's flags (how many values each takes) and its positional inputs: none, any number
// ("*") or at least one ("+"), as examples/python/client.py's argparse parser takes them.
const PROMPTS = { flags: { "--prompt": 1, "--ids": 1, "--max-new-tokens": 1 }, positional: null };
const COMMANDS = {
  generate: PROMPTS,
  logits: PROMPTS,
  classify: { flags: { "--pair": 2 }, positional: "*" },
  translate: { flags: { "--beam": 1 }, positional: "+" },
  "classify-image": { flags: {}, positional: "+" },
};

// A command line argparse would refuse: the usage and why, exit status 2 (argparse's).
function usage(message) {
  console.error(`${USAGE}\nerror: ${message}`);
  process.exit(2);
}

// What argparse reads as a flag: a word that starts with "-", but for a negative number (which
// --beam -1 and --ids -1 take as a value, to refuse it with a clear message).
const isFlag = (arg) => arg.length > 1 && arg.startsWith("-") && !/^-[0-9]+$|^-[0-9]*\.[0-9]+$/.test(arg);

// A flag as given (--max-new-tokens, --max, --ids=5,6) -> its full name and its inline value. As
// argparse, a long flag may be shortened to any prefix that names one flag alone.
function flagName(arg, flags) {
  const [given, ...rest] = arg.split("=");
  const inline = rest.length ? rest.join("=") : undefined;
  if (given in flags) return [given, inline];
  const matches = given.startsWith("--") ? Object.keys(flags).filter((f) => f.startsWith(given)) : [];
  if (matches.length === 1) return [matches[0], inline];
  if (matches.length > 1) usage(`ambiguous option: ${given} could match ${matches.join(", ")}`);
  return usage(`unrecognized arguments: ${arg}`);
}

// node client.mjs BUNDLE COMMAND [flags and inputs]: an unknown or misspelled flag, a flag without
// its values, a stray input or a missing one is a usage error, not read as a text or fed onward.
function parseArgs(argv) {
  const [bundle, command, ...rest] = argv;
  if (!bundle || isFlag(bundle)) usage("the following arguments are required: bundle, command");
  if (!command) usage("the following arguments are required: command");
  const spec = COMMANDS[command];
  if (!spec) {
    const choices = Object.keys(COMMANDS).join(", ");
    usage(`argument command: invalid choice: ${JSON.stringify(command)} (choose from ${choices})`);
  }
  const args = { bundle, command, positional: [], prompt: [], ids: [], pair: [] };
  [args.maxNewTokens, args.beam] = [null, null];
  const given = { "--prompt": [], "--ids": [], "--pair": [], "--max-new-tokens": [], "--beam": [] };
  let flagsEnded = false; // after "--", every word is an input
  for (let i = 0; i < rest.length; i++) {
    const arg = rest[i];
    if (!flagsEnded && arg === "--") flagsEnded = true;
    else if (flagsEnded || !isFlag(arg)) {
      if (!spec.positional) usage(`unrecognized arguments: ${arg}`);
      args.positional.push(arg);
    } else {
      const [flag, inline] = flagName(arg, spec.flags);
      const count = spec.flags[flag];
      const values = inline === undefined ? [] : [inline];
      if (inline !== undefined && count !== 1) usage(`argument ${flag}: expected ${count} arguments`);
      while (values.length < count && i + 1 < rest.length && !isFlag(rest[i + 1]) && rest[i + 1] !== "--")
        values.push(rest[++i]);
      if (values.length < count)
        usage(`argument ${flag}: expected ${count === 1 ? "one argument" : `${count} arguments`}`);
      given[flag].push(count === 1 ? values[0] : values);
    }
  }
  if (spec.positional === "+" && !args.positional.length)
    usage(`the following arguments are required: ${command === "translate" ? "texts" : "images"}`);
  [args.prompt, args.ids, args.pair] = [given["--prompt"], given["--ids"], given["--pair"]];
  // the last of a repeated count, as argparse keeps it
  const [count, beam] = [given["--max-new-tokens"].at(-1), given["--beam"].at(-1)];
  if (count !== undefined) args.maxNewTokens = whole("--max-new-tokens", count, 0);
  if (beam !== undefined) args.beam = whole("--beam", beam, 1);
  return args;
}

// A flag's whole number >= minimum, as the runtime takes them (beam >= 1, max_new_tokens >= 0).
function whole(flag, text, minimum) {
  const number = /^\s*-?[0-9]+\s*$/.test(text ?? "") ? Number(text) : NaN;
  if (!(number >= minimum))
    usage(`argument ${flag}: must be a whole number >= ${minimum}, got ${JSON.stringify(text)}`);
  return number;
}

// What each command serves: the manifest's task.
const TASKS = {
  generate: "causal_lm",
  logits: "causal_lm",
  classify: "classification",
  translate: "seq2seq",
  "classify-image": "image_classification",
};

async function main() {
  const args = parseArgs(process.argv.slice(2));
  const bundle = new Bundle(args.bundle);
  const task = TASKS[args.command];
  if (bundle.manifest.task !== task)
    fail(`${args.bundle} holds a ${bundle.manifest.task} model: ${args.command} needs a ${task} one`);
  let out;
  if (args.command === "generate") {
    const prompts = promptIds(bundle, args.prompt, args.ids);
    const stops = bundle.manifest.generation.stop_token_ids;
    const results = await generate(
      bundle,
      prompts,
      args.maxNewTokens ?? bundle.manifest.generation.max_new_tokens,
    );
    out = prompts.map((prompt, i) => ({
      prompt_ids: prompt,
      new_ids: results[i],
      text: bundle.tokenizer
        ? bundle.decode([...prompt, ...results[i].filter((t) => !stops.includes(t))])
        : null,
    }));
  } else if (args.command === "logits") {
    const prompts = promptIds(bundle, args.prompt, args.ids);
    const long = prompts.find((p) => p.length > bundle.context);
    if (long) fail(`a prompt of ${long.length} tokens is longer than the context (${bundle.context})`);
    out = await logitsOf(bundle, prompts);
  } else if (args.command === "classify") {
    const items = [...args.positional, ...args.pair];
    if (!items.length) fail("give at least one text or --pair to classify");
    out = await classify(bundle, items);
  } else if (args.command === "translate") {
    const targets = await translate(bundle, args.positional, args.beam);
    out = targets.map((ids) => ({ ids, text: stripAscii(bundle.decode(ids)) }));
  } else {
    out = await classifyImages(bundle, args.positional);
  }
  console.log(JSON.stringify(out));
}

// A translation without leading and trailing ASCII whitespace, as the manifest's translation
// section says (JavaScript's trim() would strip more).
function stripAscii(text) {
  return text.replace(/^[ \t\n\r\f\v]+|[ \t\n\r\f\v]+$/g, "");
}

await main();
