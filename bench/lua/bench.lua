-- One wrk script for every scenario:
--   wrk -s bench/lua/bench.lua URL -- MODE TOKEN CONNECTION [PATHS_FILE] [RUN] [CHUNK_BYTES]
-- MODE: put (srtctl-shaped lifecycle PUTs), post (submit-time POSTs), paths (GETs from a file),
--       logs (raw log chunks appended at increasing offsets; run it with -t N -cN, so each
--       thread is one connection and its own job and file, and chunks of a file stay in order)
-- TOKEN: bearer token or "-"; CONNECTION: close (a fresh connection per request) or keep
-- RUN: a prefix for job ids, distinct per wrk run so no run resends another's offsets
-- Prints one "BENCH_JSON {...}" line that bench/run.py parses.

local threads = {}
local thread_count = 0

function setup(thread)
  thread:set("tid", thread_count)
  thread_count = thread_count + 1
  table.insert(threads, thread)
end

local STARTED_METADATA = [[{"model": {"path": "/lustre/fsw/models/deepseek-ai/DeepSeek-R1-0528-FP4-v2-with-a-long-path", "container": "nvcr.io/nvidia/ai-dynamo/sglang-runtime:0.6.1-cuda13-arm64-nightly", "precision": "fp4"}, "resources": {"gpu_type": "gb200", "gpus_per_node": 4, "prefill_nodes": 2, "decode_nodes": 8, "prefill_workers": 2, "decode_workers": 4, "agg_workers": null, "cpu_allocation": "0-71,72-143", "cpu_check": "ok: 144 cpus bound to 4 gpus, numa nodes 0-1, no oversubscription"}, "benchmark": {"type": "sa-bench", "isl": 8192, "osl": 1024, "concurrencies": "1x2x4x8x16x32x64x128x256x512x1024"}, "backend_type": "sglang", "frontend_type": "dynamo", "head_node": "gb200-rack07-node-0413", "log_dir": "/lustre/fsw/coreai_devtech_all/outputs/JOBID/logs/JOBID_2P_4D_sa-bench_isl8192_osl1024_fp4_gb200_disagg", "job_name": "dsr1-fp4-gb200-2p4d-sa-bench-isl8192-osl1024-disagg-kv-router-sweep", "cluster": "CLUSTER", "tags": ["pipeline:98765", "suite:kv-router-comparison", "owner:perf-team", "priority:nightly"], "srtctl_version": "0.9.4+g1a2b3c4", "recipe_digest": "sha256:5f2d8c0e9b7a6f4e3d2c1b0a99887766554433221100ffeeddccbbaa99887766"}]]

local STEPS = {
  {"starting", "starting", "Job started on gb200-rack07-node-0413"},
  {"starting", "head_infrastructure", "Starting head infrastructure"},
  {"workers", "workers", "Starting workers"},
  {"frontend", "frontend", "Starting frontend"},
  {"frontend", "frontend", "Inference endpoint ready"},
  {"benchmark", "benchmark", "Running benchmark"},
  {"benchmark", "cleanup", "Artifacts uploaded"},
  {"completed", "cleanup", "Benchmark completed successfully"},
}
-- Job-major order: consecutive requests go to different jobs, and a job's next report
-- comes a whole round later, as with hundreds of jobs reporting side by side.
local JOBS_PER_THREAD = 500
local CLUSTERS = 4

-- ASCII log lines of 128 bytes, as a training or benchmark worker writes them.
local function log_body(size)
  local lines = {}
  for i = 0, math.floor(size / 128) - 1 do
    local head = string.format("%012d 2026-12-02T10:%02d:%02d.%03d [rank %d] step %d loss=%.4f throughput=%d tok/s",
      i * 128, math.floor(i / 60) % 60, i % 60, (i * 7) % 1000, tid, i, 1 / (i + 1), (i * 7919) % 100000)
    lines[#lines + 1] = head .. string.rep(" ", 127 - #head) .. "\n"
  end
  return table.concat(lines)
end

function init(args)
  mode = args[1]
  bad = 0
  -- answers of the logs mode that stored nothing (a resend): the bench never means to send one
  resent = 0
  -- logs mode: answers received. The next chunk's offset counts answers, not request() calls:
  -- wrk calls request() once more on the first thread to check the script, and sends nothing.
  answered = 0
  counter = 0
  run = args[5] or "r"
  wrk.headers["Content-Type"] = "application/json"
  if args[2] ~= "-" then
    wrk.headers["Authorization"] = "Bearer " .. args[2]
  end
  if args[3] == "close" then
    wrk.headers["Connection"] = "close"
  end
  if mode == "logs" then
    wrk.headers["Content-Type"] = "application/octet-stream"
    chunk = tonumber(args[6] or "") or 262144
    wrk.body = log_body(chunk)
    log_path = "/api/jobs/" .. run .. "-log" .. tid .. "/logs?cluster=c" .. (tid % CLUSTERS) ..
      "&file=logs/worker-" .. tid .. ".out&offset="
  end
  if mode == "paths" then
    paths = {}
    for line in io.lines(args[4]) do
      paths[#paths + 1] = line
    end
  end
  math.randomseed(os.time() + tid * 7919)
end

local function put_request()
  local n = counter % JOBS_PER_THREAD
  local step = math.floor(counter / JOBS_PER_THREAD) % #STEPS
  local job_id = run .. "-" .. tid .. "-" .. n
  local cluster = "c" .. (n % CLUSTERS)
  local s = STEPS[step + 1]
  local body
  if step == 0 then
    local metadata = STARTED_METADATA:gsub("JOBID", job_id):gsub("CLUSTER", cluster)
    body = '{"status": "starting", "stage": "starting", "message": "' .. s[3] ..
      '", "started_at": "2025-01-26T10:33:00Z", "updated_at": "2025-01-26T10:33:00Z", "metadata": ' .. metadata .. '}'
  elseif step == #STEPS - 1 then
    body = '{"status": "completed", "stage": "cleanup", "message": "' .. s[3] ..
      '", "exit_code": 0, "logs_url": "s3://bucket/outputs/' .. job_id .. '/", "completed_at": "2025-01-26T11:02:00Z",' ..
      ' "updated_at": "2025-01-26T11:02:00Z", "metadata": {"cluster": "' .. cluster .. '"}}'
  else
    body = '{"status": "' .. s[1] .. '", "stage": "' .. s[2] .. '", "message": "' .. s[3] ..
      '", "updated_at": "2025-01-26T10:40:00Z", "metadata": {"cluster": "' .. cluster .. '"}}'
  end
  return wrk.format("PUT", "/api/jobs/" .. job_id, nil, body)
end

local function post_request()
  local job_id = run .. "-p" .. tid .. "-" .. counter
  local body = '{"job_id": "' .. job_id .. '", "job_name": "submit-' .. counter .. '", "cluster": "c' ..
    (counter % CLUSTERS) .. '", "recipe": "recipes/gb200/dsr1-fp4.yaml", "submitted_at": "2025-01-26T10:30:00Z",' ..
    ' "metadata": {"tags": ["pipeline:98765", "suite:kv-router-comparison"], "benchmark": {"type": "sa-bench", "isl": 8192, "osl": 1024}}}'
  return wrk.format("POST", "/api/jobs", nil, body)
end

function request()
  counter = counter + 1
  if mode == "put" then
    return put_request()
  elseif mode == "post" then
    return post_request()
  elseif mode == "logs" then
    -- One connection per thread: the previous chunk was answered before this is asked for.
    -- wrk.body goes with every request.
    return wrk.format("POST", log_path .. (answered * chunk))
  end
  return wrk.format("GET", paths[math.random(#paths)])
end

function response(status, headers, body)
  answered = answered + 1
  if status < 200 or status > 299 then
    bad = bad + 1
  elseif mode == "logs" and body and string.find(body, '"stored":%s*0') then
    resent = resent + 1
  end
end

function done(summary, latency, requests)
  local non2xx, resends = 0, 0
  for _, thread in ipairs(threads) do
    non2xx = non2xx + thread:get("bad")
    resends = resends + (thread:get("resent") or 0)
  end
  local e = summary.errors
  io.write(string.format(
    'BENCH_JSON {"requests": %d, "duration_us": %d, "p50_us": %d, "p99_us": %d, "non2xx": %d, "socket_errors": %d,' ..
    ' "resent": %d}\n',
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99), non2xx,
    e.connect + e.read + e.write + e.timeout, resends))
end
