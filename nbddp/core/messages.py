"""The control pipe between the kernel and one of nbddp's own ranks: the kinds of message, each
sent as a tuple ``(kind, *payload)``. Plain strings, so a message pickles as small as it can
(an Enum member would pickle as a reference to its class). Imports nothing: the rank side
(nbddp/rank/worker.py, display.py) and the kernel side (nbddp/sources/rankprocs.py, pool.py,
nbddp/forkserver/spares.py) both read it.

torchrun's ranks have no control pipe; they leave status files (nbddp/core/rankfiles.py).
"""

# ------------------------------------------------------------- rank → kernel
READY = "ready"                # a spare, forked ahead of need, waits for its job; no payload
STARTED = "started"            # the job is applied, user code may run: (pid, time.time())
EXCEPTION = "exception"        # the user's code raised: ({type, message, traceback, cell_line})
EXIT = "exit"                  # the process exits now: (exit code)
FINISHED = "finished"          # the cell is over, the process's own exit follows: (exit code)
RETURN = "return"              # a callable's return value: (value)
RETURN_ERROR = "return_error"  # that value could not be pickled: (one-line reason)
PULLED = "pulled"              # --pull names this rank has: ({name: value}[, {name: why not sent}])
DISPLAY = "display"            # display() / plt.show() in the rank: (mime bundle dict)
FAKE = "fake"                  # --fake: what the rank holds and sent (nbddp/core/fakereport.py's data)
GPU_MEMORY = "gpu_memory"      # the cell used CUDA: ([per device: nbddp/rank/gpumemory.py's measure()])
BEGAN = "began"                # a pool rank started the cell just sent (SIGINT is for it now); none
DONE = "done"                  # a pool rank ended that cell: (DONE_OK | DONE_INTERRUPTED | DONE_ERROR)
ASK = "ask"                    # the rank reads its stdin (input(), pdb): (ask id, prompt, ASK_INPUT |
                               # ASK_DEBUGGER | ASK_POST_MORTEM); it blocks until ANSWER / NO_ANSWER.
                               # prompt None: its debugger waits for its turn (shows nothing before)
LEFT_DEBUGGER = "left_debugger"  # `c` or `q` (or the post-mortem's end): the input box is free; none

# ------------------------------------------------------------- kernel → rank (the same pipe, duplex)
EXEC = "exec"                  # run a cell: (nbddp.core.job.Cell)
STOP = "stop"                  # leave the serve loop and exit; no payload
ANSWER = "answer"              # the line typed in the notebook's input box for ASK: (ask id, line)
NO_ANSWER = "no_answer"        # no one will answer that ASK: (ask id, NO_FRONTEND | NOT_FIRST)

# how a pool rank's cell ended (the payload of DONE)
DONE_OK, DONE_INTERRUPTED, DONE_ERROR = "ok", "interrupted", "error"

# what an ASK is for (its prompt is shown as it is; the kernel decides who may ask and when)
ASK_INPUT, ASK_DEBUGGER, ASK_POST_MORTEM = "input", "debugger", "post-mortem"
# why no one answers: no front end can (papermill, nbclient, nbddp.run outside a notebook), or a
# post-mortem after the first rank's (--pdb debugs the first rank to fail only)
NO_FRONTEND, NOT_FIRST = "no front end", "not first"
