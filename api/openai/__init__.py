"""OpenAI's chat completions and completions: request models, the prompt, tools, constraints,
sampling, the engine requests behind a reply, and the reply's bodies and chunks."""
