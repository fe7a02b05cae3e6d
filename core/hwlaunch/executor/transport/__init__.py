"""How a call and its reply travel between the driver and the workers, for every executor.

Why one package: what a message looks like (the request header, the call's pickling with its
payload reductions, the callables sent once then by digest, the memory lent to results) and
how a reply is encoded were spread over the mp and Ray folders and ``_runtime``. Here:

- ``codec``: the codecs, one object per wire format (the mp channels' frames, Ray's pickles),
  each with ``encode_request``, ``decode_request``, ``encode_reply``, ``decode_reply``; and
  ``answer``, a worker's reply to one encoded request;
- ``_wire``: the frame layout (pickle protocol 5, buffers apart); ``_reductions``: how
  tensors, arrays and memoryviews hand their memory to it; ``_messages``: the mp request header;
- ``_callables``: a callable pickled once (``hwlaunch.executor._callable_cache``), sent whole
  once, then by digest;
- ``_loans``: the shared memory a decoded result views, and when it is free again.

Nothing here imports the planning layer or the CLI: both worker and driver processes use it.
"""
