"""Real multimodal data for the trainer through megatron-energon.

Modules (none imports energon/torch at import time except task_encoder, energon_provider and samples, which
only the trainer and the `data` commands load):
  batch          the batch contract between providers and the trainer's step
  mock           the mock provider, and the branch to energon (make_provider)
  synth          synthetic image-caption, text-only, VQA and conversation shards, energon-prepared, + a blend
  synth_multi    synthetic datasets whose samples hold several images
  synth_audio    a synthetic dataset of samples with audio clips, images, both or neither
  shards         the one writer of energon datasets: webdataset shards, index, split.yaml, dataset.yaml
  llava          one LLaVA/ShareGPT-style JSONL record, checked (pure)
  prepare        `data prepare`: a JSONL file and its images -> an energon dataset, streamed
  image_file     one image of a record checked before it is read: where it is, its size, a full decode
  video_file     one video file of a record (PyAV) -> its frames sampled uniformly in time, as PNG frames
  tokenizer      built-in character tokenizer (synthetic data) or a local HuggingFace tokenizer
  chat           plain and chat-template layouts: token ids and which tokens carry loss (pure)
  samples        JSON-member decoding, the ConversationSample (and, read only, MediaSample) types, sample loaders (energon)
  scan, stats    `data stats`: one pass through the task encoder (energon), and its summary (pure)
  images         image size -> patch-token count and pixel preprocessing shared with the trainer's encoder
  audio          audio clips (log-mel `.npy` members): header checks, loading, the audio encoder's token rule
  audio_input    audio files (`.npy`, PCM `.wav`) -> log-mel clips as Whisper's feature extractor makes them
  task_encoder   energon TaskEncoder: placeholders, labels, loss mask, flat variable-length image batches
  energon_provider  the trainer's Provider: one savable energon loader per LLM DP lane, exact resume
  mux            one energon loader for the several lanes an encoder replica serves
  loader_state   the checkpointed energon loader state, pickled and read back as data only
  packing        sequence packing (pure): which samples share a row, and where each sits
  check          cheap checks of an energon data setting before any loader exists (no energon import)
  errors         DataError: names the dataset, shard and sample a problem is in
"""
