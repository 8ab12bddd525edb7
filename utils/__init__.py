"""Shared, tested code of the course "Sequence Models, from RNNs to Transformers".

Modules (each notebook imports what it needs):
- `utils.settings`: fast/full mode (`pick`), device, seeding, the run header (`setup`)
- `utils.data`: the course datasets, their sources and checksums, loaders
- `utils.text`: tokenizers, `Vocab`, padding (`PadCollate`), length bucketing, random windows of a token stream
- `utils.train`: the training loop (`fit`, `evaluate`), checkpoints, AdamW with decay on matrices, parameter counts
- `utils.plots`: training curves and heatmaps
- `utils.metrics`: perplexity and BLEU (02)
- `utils.ngram`: count-based n-gram language models, the baselines to beat (02)
- `utils.rnn`: RNN from scratch, gradient clipping, the character language model (03)
- `utils.bptt`: backpropagation through time by hand, truncated BPTT (04)
- `utils.tasks`: the long-range recall task and a recurrent classifier (04, 05)
- `utils.gated`: LSTM and GRU from scratch, the open-gate initialization (05)
- `utils.classifiers`: the IMDB text classifiers, one calling convention, incl. the Transformer classifier (06, 08)
- `utils.encoders`: the pretrained MiniLM sentence encoder, loaded offline (06)
- `utils.attention`: score functions, masked softmax, attention pooling, multi-head attention with a key/value cache, reading attention heads (07-12)
- `utils.seq2seq`: the Multi30k translation pipeline, recurrent encoder-decoders, training and BLEU evaluation (07, 10)
- `utils.decoding`: greedy decoding, beam search and sampling, written once (07)
- `utils.transformer`: positional encodings, layer norm, feed-forward, encoder and decoder blocks, the encoder-decoder Transformer (08, 09, 10; 11-14 build on it)
- `utils.schedules`: warm-up + cosine and inverse-square-root learning-rate schedules (05, 10-14)
- `utils.gpt`: the decoder-only language model, equal to GPT-2 with copied weights, its evaluation and `train_lm` (11)
- `utils.bert`: the BERT-style encoder that runs the real MiniLM weights, MLM masking, fine-tuning batches in true epochs (12)
- `utils.vit`: the Vision Transformer (patches, class token, equal to Hugging Face's ViT with copied weights), the CNN baseline and their training recipe (13)
- `utils.taming`: training-stability runs (same steps; failed and non-finite runs told apart) and their diagnostics: per-block gradients, layer-norm Jacobian, RAdam's rectification (14)
- `utils.compare`: which of two scores is better (NaN-safe), headline verdicts, paired intervals and other decision helpers
- `utils.loading`: the configuration check every weight loader (`load_from_torch`, `load_from_hf`) shares
- `utils.show`: render a `utils` definition's source in a notebook; results tables (`Table`)
- `utils.results`: record a full run's headline numbers (`save_results`) and read another notebook's (`load_metrics`)

The machinery that runs, checks and publishes the notebooks (runner, website, slides, student
edition, README tables, device check) is the separate package `course`.
"""

from utils.settings import get_device, is_fast, pick, seed_everything, setup

__all__ = ["get_device", "is_fast", "pick", "seed_everything", "setup"]
