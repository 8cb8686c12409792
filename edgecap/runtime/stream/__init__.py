"""Caption a stream as it plays: frame sources (video files, cameras, RTSP/HTTP, GStreamer, image folders), sampling
on the stream's own clock, an on-change gate, the captioning pipeline and subtitle/JSONL outputs
(``docs/streams.md``)."""
