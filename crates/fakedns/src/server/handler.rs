//! hickory's request hook: turns a [`Reply`] into a DNS message on the wire.

use std::net::IpAddr;
use std::sync::Arc;

use hickory_server::net::runtime::Time;
use hickory_server::net::xfer::Protocol;
use hickory_server::proto::op::{Header, HeaderCounts, Metadata, ResponseCode};
use hickory_server::proto::rr::rdata::{A, AAAA, SOA};
use hickory_server::proto::rr::{Name, RData, Record, RecordType};
use hickory_server::server::{Request, RequestHandler, ResponseHandler, ResponseInfo};
use hickory_server::zone_handler::MessageResponseBuilder;

use super::answer::{Family, Reply};
use super::{QueryRecord, Shared, Transport};
use crate::zone::normalize;

pub(super) struct Handler {
    shared: Arc<Shared>,
}

impl Handler {
    pub(super) fn new(shared: Arc<Shared>) -> Self {
        Handler { shared }
    }
}

#[async_trait::async_trait]
impl RequestHandler for Handler {
    async fn handle_request<R: ResponseHandler, T: Time>(
        &self,
        request: &Request,
        mut response_handle: R,
    ) -> ResponseInfo {
        let transport = match request.protocol() {
            Protocol::Tcp => Transport::Tcp,
            _ => Transport::Udp,
        };
        let mut metadata = Metadata::response_from_request(&request.metadata);
        metadata.authoritative = true;
        metadata.recursion_available = false;

        let Ok(info) = request.request_info() else {
            // Not exactly one question: nothing sensible to answer.
            self.shared.record(QueryRecord {
                at: std::time::SystemTime::now(),
                name: String::new(),
                qtype: String::new(),
                client: request.src(),
                transport,
                answer: "FORMERR".to_owned(),
            });
            metadata.response_code = ResponseCode::FormErr;
            let response =
                MessageResponseBuilder::from_message_request(request).build_no_records(metadata);
            return send(&mut response_handle, response, metadata).await;
        };

        let qname: Name = info.query.original().name().clone();
        let qtype = info.query.query_type();
        let family = match qtype {
            RecordType::A => Family::V4,
            RecordType::AAAA => Family::V6,
            _ => Family::Other,
        };
        let key = normalize(&info.query.name().to_string());
        let (reply, ttl) =
            self.shared
                .answer(&key, family, qtype.to_string(), request.src(), transport);

        let mut answers = Vec::new();
        let mut authority = Vec::new();
        match &reply {
            Reply::Silent => {
                // Nothing is sent; hickory only logs the returned info.
                metadata.response_code = ResponseCode::ServFail;
                return ResponseInfo::from(Header {
                    metadata,
                    counts: HeaderCounts::default(),
                });
            }
            Reply::Addrs(addrs) => {
                metadata.response_code = ResponseCode::NoError;
                answers = addrs
                    .iter()
                    .map(|ip| {
                        let rdata = match ip {
                            IpAddr::V4(v4) => RData::A(A::from(*v4)),
                            IpAddr::V6(v6) => RData::AAAA(AAAA::from(*v6)),
                        };
                        Record::from_rdata(qname.clone(), ttl, rdata)
                    })
                    .collect();
            }
            Reply::NoData => {
                metadata.response_code = ResponseCode::NoError;
                authority.extend(soa_for(&qname, ttl));
            }
            Reply::NxDomain => {
                metadata.response_code = ResponseCode::NXDomain;
                authority.extend(soa_for(&qname, ttl));
            }
            Reply::ServFail => metadata.response_code = ResponseCode::ServFail,
            Reply::Refused => {
                metadata.response_code = ResponseCode::Refused;
                metadata.authoritative = false;
            }
        }
        let response = MessageResponseBuilder::from_message_request(request).build(
            metadata,
            answers.iter(),
            authority.iter(),
            std::iter::empty(),
            std::iter::empty(),
        );
        send(&mut response_handle, response, metadata).await
    }
}

async fn send<'a, R: ResponseHandler>(
    handle: &mut R,
    response: hickory_server::zone_handler::MessageResponse<
        '_,
        'a,
        impl Iterator<Item = &'a Record> + Send + 'a,
        impl Iterator<Item = &'a Record> + Send + 'a,
        impl Iterator<Item = &'a Record> + Send + 'a,
        impl Iterator<Item = &'a Record> + Send + 'a,
    >,
    metadata: Metadata,
) -> ResponseInfo {
    match handle.send_response(response).await {
        Ok(info) => info,
        Err(error) => {
            tracing::debug!(%error, "fake DNS could not send a response");
            let mut metadata = metadata;
            metadata.response_code = ResponseCode::ServFail;
            ResponseInfo::from(Header {
                metadata,
                counts: HeaderCounts::default(),
            })
        }
    }
}

/// An SOA for the zone apex above `name`, so that resolvers can cache a negative answer
/// for `ttl` seconds (RFC 2308: the negative TTL is min(SOA TTL, SOA minimum)).
fn soa_for(name: &Name, ttl: u32) -> Option<Record> {
    let apex = if name.num_labels() > 1 {
        name.base_name()
    } else {
        name.clone()
    };
    let mname = Name::from_ascii("ns").ok()?.append_domain(&apex).ok()?;
    let rname = Name::from_ascii("hostmaster")
        .ok()?
        .append_domain(&apex)
        .ok()?;
    let soa = SOA::new(mname, rname, 1, 60, 10, 600, ttl);
    Some(Record::from_rdata(apex, ttl, RData::SOA(soa)))
}
