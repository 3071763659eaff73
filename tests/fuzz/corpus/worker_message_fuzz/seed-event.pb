*<
job-1"1{"type":"metric","step":10,"values":{"loss":1.5}}P