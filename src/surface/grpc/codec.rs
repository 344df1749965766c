//! The protobuf codec of the generated services (`build.rs` names it): prost's, except that a
//! message that cannot be decoded is the sender's mistake, INVALID_ARGUMENT naming the decode
//! problem, where prost's codec answers INTERNAL (no client mistake is ever answered INTERNAL).
//!
//! This is the one place a decode error becomes a status: for a unary request it is the RPC's
//! answer, and on a client stream (`Connect`) the handler ends the stream with it.

use std::marker::PhantomData;

use tonic::Status;
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder};
use tonic_prost::{ProstCodec, ProstEncoder};

/// prost's codec with decode errors answered as INVALID_ARGUMENT.
#[derive(Debug, Clone)]
pub struct ProtoCodec<T, U>(ProstCodec<T, U>);

impl<T, U> Default for ProtoCodec<T, U> {
    fn default() -> Self {
        Self(ProstCodec::default())
    }
}

impl<T, U> Codec for ProtoCodec<T, U>
where
    T: prost::Message + Send + 'static,
    U: prost::Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = ProtoDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        self.0.encoder()
    }

    fn decoder(&mut self) -> Self::Decoder {
        ProtoDecoder(PhantomData)
    }
}

/// Decodes like prost's decoder; a message that does not decode is INVALID_ARGUMENT.
#[derive(Debug, Clone)]
pub struct ProtoDecoder<U>(PhantomData<U>);

impl<U: prost::Message + Default> Decoder for ProtoDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        // Decoded here rather than through prost's decoder, whose error has already lost the
        // kind of failure (it is a Status::internal).
        U::decode(buf).map(Some).map_err(|err| {
            Status::invalid_argument(format!("the message could not be decoded: {err}"))
        })
    }

    fn buffer_settings(&self) -> BufferSettings {
        BufferSettings::default()
    }
}
