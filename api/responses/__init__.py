"""OpenAI's Responses API, translated onto the chat machinery, with its stored responses."""
