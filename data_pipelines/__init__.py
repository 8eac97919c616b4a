"""Data for jaxspatial: synthetic scenes, the TFDS ArrayRecord builders, the grain loader into
`Task` batches, the papers' benchmarks in their published formats and their protocols.

Modules:
- synthetic/ shapes.py (surface samplers), room.py (make_room: a room with objects as a coloured point
  cloud with instance ids and object metadata), rigs.py (orbit, rotation, arc rigs),
  questions.py (templated questions, geometric answers),
- samples.py (room + rig + renders + questions; disjoint split seeds),
- episodes.py (batches of Act3D tasks and first prompts for rollouts),
- look_around.py (the main job's task and its scripted explorer),
- thinker3d.py (3DThinker's three-view task, stand-in features via the cache),
- stand_in_features.py (GeometryStandInExtractor: VGGT-shaped features from the scenes' depth
  and poses, for synthetic data),
- teachers.py (SFT trajectory files: JSON lines of model turns, replayed through the
  environment, a question named by scene seed + index or, on a benchmark, by `question_id`; the
  scripted teacher for the synthetic dataset)
- builders/ synthetic_spatial.py: TFDS ArrayRecord builder (configs tiny, small, base);
- spatial_benchmark.py: SpatialBenchmark, the papers' benchmarks as TFDS ArrayRecord scenes
  (configs = launch.build_benchmark's names: mindcube, mindcube_tiny, blink_mv, vsibench,
  scanqa, sqa3d, chartqa, hrbench; SPLITS: each split's files in the published layout under
  `source` (train splits of mindcube, scanqa, sqa3d, chartqa), absent splits skipped; options
  width / height (views letterboxed), caches, frames, points, scans; `questions=` one file),
  BENCHMARK_LIMITS / task_limits, build_benchmark, load_benchmark (a missing build names the
  command)
- benchmarks/ scene.py: BenchmarkScene (one stored example: geometry "scan", "reconstruction" or "none",
  views, cameras, cloud, objects, questions as JSON with question_id / category / answers /
  views), letterbox, nominal_cameras; images.py: MindCube, BLINK-MV, VSI-Bench (frames at
  floor(t + 0.5), t in linspace(0, N - 1, 7), decoded with PyAV), ChartQA, HR-Bench -> scenes,
  one per distinct image set (Think3D caches by scene_caches' manifest give the cloud and
  poses); scannet.py: ScanQA and SQA3D -> one scene per ScanNet scan (cloud subsampled to
  `points`, instance ids, the initial viewpoint and its 640x480 render: see Data)
- loader.py grain: scene examples -> one Task per question -> batches (numpy pytrees); per-process shards,
  clouds padded to one size, resumable iterator state; the stored views as `Task.input_images`
  when asked (Think3D); TaskLimits (question bytes, answers and their bytes, answer objects,
  questions per scene: the synthetic set's 384 / 4 x 128 / 4 / 16, the benchmarks' 1024 / 10 x
  192 / 32 / 512); benchmark records (`benchmark` set) name a category per question instead of a
  family, may have an empty cloud (geometry "none"), and give meta question_id / category
- sample_sheet.py: a PNG of built records (every view framed and numbered, the questions with
  one option per line), what launch.show_samples writes
- readers/ MindCube, ScanQA, BLINK, VSI-Bench, SQA3D, ChartQA, HR-Bench in their published formats;
  scannet.py: read_scan (ScanNet v2's vh_clean_2.ply, segs.json, aggregation.json,
  axisAlignment; ScanFormatError / MissingScanError naming file and field)
- caches.py Think3D point-cloud .npz, 3DThinker feature_vggt/{idx}/vggt.npz (atomic writes);
  write_reconstruction_cache (a perception.Reconstruction -> Think3D's cache)
- thinker3d_data.py 3DThinker's published data: the training JSONL (text_input, image_input, text_output, answer,
  idx; Thinker3DFormatError naming file, row, idx, field; MissingFrameError the frame's path),
  frames resized as the public feature script does (PIL Lanczos to 480 wide x 640 tall: 391
  vision tokens), the VGGT features per idx (MissingFeaturesError: idx and path; the frame count
  checked), the public instruction appended to text_input, MindCube-Tiny as held-out rows, rows
  grouped by their number of frames
- reconstruct.py Open3D fusion of posed RGB-D views (unproject or UniformTSDFVolume); RGBDReconstructor (the
  same, as a perception.Reconstruction)
- protocols.py the papers' evaluation protocols per benchmark (PROTOCOLS: mindcube, mindcube_tiny, vsibench,
  vsibench_tiny, blink_mv, scanqa, sqa3d, chartqa, hrbench): the table's columns in the paper's
  order and the raw categories each takes (MindCube: rotation / around / among, the id's prefix;
  VSI-Bench: the question type, relative direction's easy / medium / hard as one column),
  overall micro or macro, each question's metric (VSI-Bench: MRA for its numeric types), the
  answer rules (the official code's by default; `protocol(name, letter_rule=, extract=, ...)`
  for a named option), `judged` (which questions a judge scores: open answers, every HR-Bench
  question); `score`; `counts` per column
- scene_caches.py a benchmark's image sets (each question's image list, deduplicated) -> one Think3D cache each
  (hash-named, atomic; existing ones skipped, so a rerun resumes), manifest.json (lists ->
  files, questions, failures)

**Synthetic questions** (`data_pipelines/synthetic/questions.py`). Directions are read in the
floor plane from a view's camera (+z up): "to the left of A from view k" is left of A as camera
k sees it. A question is asked only when unambiguous: the answer within 30 degrees of its axis,
every distractor at least 60 degrees from it; "closest" needs a 1.25x margin; only objects with
unique names are referred to. `needs_exploration` is read from the initial view's instance image
(fewer than 12 pixels of every answer object). Splits draw scene seeds from disjoint ranges.

**Records and tasks.** One TFDS example per scene (cloud, PNG views, depth, cameras, objects,
questions as JSON); the loader expands each question into a `Task` padded to the cloud's bucket,
8 input cameras (the last repeated) and byte-level text ids (`encode_text`; a policy tokenizer
re-encodes from them): the question, and up to 4 reference answers of 128 bytes (a question
record's `answers` list when it has several, else its `answer_text`). With `input_images=True`
the scene's stored views ride along as `Task.input_images` (their size checked against the
cameras' principal points). TFDS orders examples by key hash: look scenes up by `scene_seed`.

**Readers** return `BenchmarkQuestion`s and raise `BenchmarkFormatError` / `MissingImageError`
naming the file, the row, the record id and the field.

**Benchmark scenes** (`data_pipelines/benchmarks/`; choices where the papers are silent). Stored
views are letterboxed (PIL bicubic, aspect kept, centred on black) to the config's size (640 x
480; ChartQA 800 x 600, HR-Bench 1344 x 1008). Image benchmarks group questions by their image
list (one scene per list). Geometry "none" has nominal cameras (focal = the larger side,
principal point at the centre, identity poses); "reconstruction" takes the cloud and camera
poses of Think3D's cache (which stores no intrinsics: nominal ones). Act3D starts "from one
fixed initial viewpoint per task" without saying how it is chosen: ours, from the scan alone
(never the questions or answer objects), is the eye 1.5 m above the aligned scan's lowest point
(half the height in rooms under 1.8 m), on a grid over the floor bounds shrunk by 0.3 m (at most
0.5 m apart, 12 per axis) x 8 level yaws, at least 0.3 m from every scan point, scored by
distinct objects seen (>= 8 pixels each) then points in a 160 x 120 render, ties to the first
(`benchmarks/scannet.py` ViewRule); renders use a 90-degree horizontal field of view. SQA3D
starts at its situation's position and facing (the raw mesh's bounding-box centre as origin, the
agent along -x turned by the (x, y, z, w) quaternion, as SQA3D's visualiser draws it; unverified
against a real scan), one camera per situation, at most 8 per record. VSI-Bench: 7 frames per
video at floor(t + 0.5) for t in linspace(0, N - 1, 7) (Think3D's count; its indices are not
published). ScanQA object ids are ScanNet objectIds; those absent from the subsampled scan are
dropped from `answer_objects`. SQA3D's category is its question's first word (what, is, how,
can, which, else others), as LEO / 3D-VisTA evaluate it.
"""

