-- append (worker): one step's token events for one job, only while `attempts` still equals
-- the writer's attempt (the fence) and the job runs. A token is written only if its index
-- is the next one (`n_tokens`), so a step replayed after a failed or cut pipeline (Redis
-- restarted mid-write) adds nothing twice and never leaves a gap.
-- A token that carries an entry id is one this attempt wrote before and the stream has
-- lost (a Redis failover: the promoted replica never got it). It is written again with
-- that id, so a client that saw it (and resumes after it with Last-Event-ID) does not see
-- it twice; where the stream is already past that id, with a new one.
-- The tokens written are announced on the stream's pub/sub channel (the API's readers,
-- api/stream_notify.py) as JSON: [prev, id, [fields], id, [fields], ...], where prev is
-- the id of the entry before the first one written. A reader whose cursor is at prev
-- delivers them as they are; any other reader takes the message as a hint and reads.
-- More than MAX_CARRIED tokens in one call: an empty message (a hint only).
-- Returns {0, -1} fenced off, else {status, n, id...}: status 1 written, 2 written and the
-- job's cancel was requested; n the stream's token count now (where it really ends: fewer
-- than the writer sent means tokens were lost, to re-send from index n); then the entry ids
-- of the tokens this call wrote, for indexes n - #ids .. n - 1.
local job_key, events_key = KEYS[1], KEYS[2]
local attempt, maxlen = ARGV[1], ARGV[2]
-- then (data, token id, index, entry id or '') per token, from ARGV[3] on
local MAX_CARRIED = 64

if redis.call('HGET', job_key, 'attempts') ~= attempt then return {0, -1} end
if redis.call('HGET', job_key, 'state') ~= 'running' then return {0, -1} end
local n = tonumber(redis.call('HGET', job_key, 'n_tokens') or '0')
local answer = {1, 0}
local carried = {}  -- the announcement: prev, then id and fields per token
for i = 3, #ARGV, 4 do
  local data, token_id, index, entry_id = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
  if tonumber(index) == n then
    if #carried == 0 then
      local last = redis.call('XREVRANGE', events_key, '+', '-', 'COUNT', 1)
      carried[1] = last[1] and last[1][1] or '0-0'
    end
    local id = false
    if entry_id ~= '' then
      id = redis.pcall('XADD', events_key, 'MAXLEN', '~', maxlen, entry_id,
                       'e', 'token', 'd', data, 't', token_id)
      if type(id) ~= 'string' then id = false end  -- refused: the stream is past that id
    end
    if not id then
      id = redis.call('XADD', events_key, 'MAXLEN', '~', maxlen, '*',
                      'e', 'token', 'd', data, 't', token_id)
    end
    answer[#answer + 1] = id
    carried[#carried + 1] = id
    carried[#carried + 1] = {'e', 'token', 'd', data, 't', token_id}
    n = n + 1
  end
end
redis.call('HSET', job_key, 'n_tokens', n)
-- once per call (pcall: see terminal.lua; the tokens are written by now, so nothing after
-- them may fail the script)
if #answer > 2 then
  local ok, message = false, ''
  if #answer <= 2 + MAX_CARRIED then ok, message = pcall(cjson.encode, carried) end
  redis.pcall('PUBLISH', events_key, ok and message or '')
end
answer[2] = n
if redis.call('HGET', job_key, 'cancel_requested') == '1' then answer[1] = 2 end
return answer
